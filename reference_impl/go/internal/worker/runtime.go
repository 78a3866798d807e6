package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"fencecheck/goworker/internal/heartbeat"
	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/metrics"
	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/sealing"
	"fencecheck/goworker/internal/tool"
)

// Runtime wires one worker session: settings, protocol (correct or a
// mutant), the main session and the components on it.
type Runtime struct {
	S      Settings
	P      *protocol.Protocol
	Main   *protocol.Session
	Tools  *tool.Client
	Seal   *sealing.Sealer
	Writer *protocol.Writer
	Disp   *protocol.Dispatcher
	Recon  *protocol.Reconciler
	Cons   *protocol.Consumer
}

// NewRuntime checks the settings and connects nothing yet.
func NewRuntime(s Settings, p *protocol.Protocol) (*Runtime, error) {
	if s.DSN == "" {
		return nil, fmt.Errorf("no database: set FENCECHECK_DSN")
	}
	main, err := protocol.NewSession(s.DSN, s.WorkerID)
	if err != nil {
		return nil, fmt.Errorf("FENCECHECK_DSN: %w", err)
	}
	seal, err := sealing.New(s.DataKey)
	if err != nil {
		return nil, err
	}
	tools := tool.New(s.ToolURL, s.BrokerURL, s.ToolTimeout)
	disp := &protocol.Dispatcher{P: p, Tools: tools, Owner: s.Owner(), Seal: seal}
	return &Runtime{
		S: s, P: p, Main: main, Tools: tools, Seal: seal,
		Writer: &protocol.Writer{P: p, S: main, Seal: seal},
		Disp:   disp,
		Recon:  &protocol.Reconciler{D: disp, TTLMS: s.DispatchTTLMS},
		Cons:   &protocol.Consumer{P: p, Broker: tools, Tenant: s.Tenant},
	}, nil
}

// CheckBinding refuses to work for another tenant than the login role's
// binding (worker contract section 7): FENCECHECK_TENANT names the tenant
// in payloads and operation ids, the database decides what the session
// may see, and the two must agree.
func (rt *Runtime) CheckBinding(ctx context.Context) error {
	bound, err := rt.Main.BoundTenant(ctx)
	if err != nil {
		return fmt.Errorf("reading the login role's tenant binding: %w", err)
	}
	if bound != rt.S.Tenant {
		return fmt.Errorf("the login role of FENCECHECK_DSN is bound to tenant %q, not FENCECHECK_TENANT %q: "+
			"bind it (public.tenant_bindings, as superuser) or use the role of that tenant", bound, rt.S.Tenant)
	}
	return nil
}

// StartMetrics serves the metrics (FENCECHECK_METRICS_PORT) with the
// database gauges read through a session of the process's own login role.
func (rt *Runtime) StartMetrics() error {
	if rt.S.MetricsPort == "" {
		return nil
	}
	gauges := rt.NewSession()
	metrics.Gauges = func(ctx context.Context) ([]metrics.Sample, error) {
		c, err := gauges.Conn(ctx)
		if err != nil {
			return nil, err
		}
		s, err := protocol.DatabaseGauges(ctx, c)
		gauges.Check(err)
		return s, err
	}
	return metrics.Serve(rt.S.MetricsPort)
}

// NewSession is another session of the same worker (another goroutine).
func (rt *Runtime) NewSession() *protocol.Session {
	s, _ := protocol.NewSession(rt.S.DSN, rt.S.WorkerID)
	return s
}

// NewWriter is a protected-write path on its own session.
func (rt *Runtime) NewWriter(s *protocol.Session) *protocol.Writer {
	return &protocol.Writer{P: rt.P, S: s, Seal: rt.Seal}
}

// StartHeartbeat renews lease on a session of its own until ctx ends; an
// unconfirmed renewal cancels ctx (through the protocol's OnRenewUnconfirmed).
func (rt *Runtime) StartHeartbeat(ctx context.Context, cancel context.CancelCauseFunc, lease protocol.Lease,
	interval, timeout time.Duration) (done <-chan struct{}) {
	session := rt.NewSession()
	finished := make(chan struct{})
	timeout = rt.P.RenewBound(timeout)
	renew := func(callCtx context.Context) error {
		ep := lease.Epoch
		injection.Record(injection.Event{Type: "invoke", Op: "renew", RunID: lease.RunID, Epoch: &ep})
		conn, err := session.Conn(callCtx)
		if err == nil {
			_, err = rt.P.Renew(callCtx, conn, lease, rt.S.LeaseTTLMS)
		}
		session.Check(err)
		switch {
		case err == nil:
			metrics.Inc(metrics.LeaseRenew, "success")
			injection.Record(injection.Event{Type: "ok", Op: "renew", RunID: lease.RunID, Epoch: &ep})
			// The renewal committed and is confirmed: the lease outlives this
			// process by up to one lease duration; the execution has not gone on.
			injection.Point("after_renew_commit", lease.RunID, &ep, nil, "")
		case protocol.ClassOf(err) == "LeaseLost":
			metrics.Inc(metrics.LeaseRenew, "lost")
			metrics.Inc(metrics.RenewalFailures)
			metrics.Inc(metrics.StaleFence)
			injection.Record(injection.Event{Type: "fail", Op: "renew", RunID: lease.RunID, Epoch: &ep,
				Error: "LeaseLost", Detail: map[string]any{"outcome": protocol.ReasonOf(err)}})
		default:
			metrics.Inc(metrics.LeaseRenew, "unknown")
			metrics.Inc(metrics.RenewalFailures)
			session.Discard()
			injection.Record(injection.Event{Type: "info", Op: "renew", RunID: lease.RunID, Epoch: &ep,
				Error: protocol.ClassOf(err), Detail: map[string]any{"why": err.Error()}})
		}
		return err
	}
	before := func() { injection.Point("before_renew", lease.RunID, &lease.Epoch, nil, "") }
	onUnconfirmed := func(c context.CancelCauseFunc, cause error) {
		logf(lease, "lease renewal unconfirmed: %v", cause)
		rt.P.OnRenewUnconfirmed(c, cause)
	}
	go func() {
		defer close(finished)
		defer session.Close()
		// Connect before the first tick, outside any renewal's timeout: a
		// renewal's budget is for the renewal (a failure here is the first
		// renewal's to report).
		connectCtx, stop := context.WithTimeout(ctx, time.Duration(rt.S.LeaseTTLMS)*time.Millisecond)
		_, _ = session.Conn(connectCtx)
		stop()
		heartbeat.Heartbeat(ctx, cancel, interval, timeout, renew, before, onUnconfirmed)
	}()
	return finished
}

// Close ends the main session.
func (rt *Runtime) Close() { rt.Main.Close() }

// logf writes one JSON log line on stderr carrying the lease's identities
// and its trace_id (contract section 8); never a request body, a
// checkpoint state or a run input.
func logf(l protocol.Lease, format string, args ...any) {
	logLine(map[string]any{"run_id": l.RunID, "owner": l.Owner, "epoch": l.Epoch}, format, args...)
}

// logLine writes fields and the message as one JSON line on stderr.
func logLine(fields map[string]any, format string, args ...any) {
	line := map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "msg": fmt.Sprintf(format, args...)}
	for k, v := range fields {
		line[k] = v
	}
	if run, ok := fields["run_id"].(string); ok && run != "" {
		if epoch, ok := fields["epoch"].(int64); ok {
			line["trace_id"] = TraceID(run, epoch)
		}
	}
	b, _ := json.Marshal(line)
	_, _ = os.Stderr.Write(append(b, '\n'))
}

// TraceID of an execution: the first 32 hex digits of sha256("run_id:epoch"),
// the same in the worker, its heartbeat and any process that logs about it.
func TraceID(runID string, epoch int64) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s:%d", runID, epoch)))
	return hex.EncodeToString(sum[:16])
}
