package worker

import (
	"context"
	"fmt"
	"os"
	"time"

	"fencecheck/goworker/internal/heartbeat"
	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/tool"
)

// Runtime wires one worker session: settings, protocol (correct or a
// mutant), the main session and the components on it.
type Runtime struct {
	S      Settings
	P      *protocol.Protocol
	Main   *protocol.Session
	Tools  *tool.Client
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
	main, err := protocol.NewSession(s.DSN, s.Tenant, s.WorkerID)
	if err != nil {
		return nil, fmt.Errorf("FENCECHECK_DSN: %w", err)
	}
	tools := tool.New(s.ToolURL, s.BrokerURL, s.ToolTimeout)
	disp := &protocol.Dispatcher{P: p, Tools: tools, Owner: s.Owner()}
	return &Runtime{
		S: s, P: p, Main: main, Tools: tools,
		Writer: &protocol.Writer{P: p, S: main},
		Disp:   disp,
		Recon:  &protocol.Reconciler{D: disp, TTLMS: s.DispatchTTLMS},
		Cons:   &protocol.Consumer{P: p, Broker: tools, Tenant: s.Tenant},
	}, nil
}

// NewSession is another session of the same worker (another goroutine).
func (rt *Runtime) NewSession() *protocol.Session {
	s, _ := protocol.NewSession(rt.S.DSN, rt.S.Tenant, rt.S.WorkerID)
	return s
}

// StartHeartbeat renews lease on a session of its own until ctx ends; an
// unconfirmed renewal cancels ctx (through the protocol's OnRenewUnconfirmed).
func (rt *Runtime) StartHeartbeat(ctx context.Context, cancel context.CancelCauseFunc, lease protocol.Lease,
	interval, timeout time.Duration) (done <-chan struct{}) {
	session := rt.NewSession()
	finished := make(chan struct{})
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
			injection.Record(injection.Event{Type: "ok", Op: "renew", RunID: lease.RunID, Epoch: &ep})
		case protocol.ClassOf(err) == "LeaseLost":
			injection.Record(injection.Event{Type: "fail", Op: "renew", RunID: lease.RunID, Epoch: &ep,
				Error: "LeaseLost", Detail: map[string]any{"outcome": protocol.ReasonOf(err)}})
		default:
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
		heartbeat.Heartbeat(ctx, cancel, interval, timeout, renew, before, onUnconfirmed)
	}()
	return finished
}

// Close ends the main session.
func (rt *Runtime) Close() { rt.Main.Close() }

// logf writes one JSON log line on stderr carrying the lease's identities.
func logf(l protocol.Lease, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "{\"time\": %q, \"run_id\": %q, \"owner\": %q, \"epoch\": %d, \"msg\": %q}\n",
		time.Now().UTC().Format(time.RFC3339Nano), l.RunID, l.Owner, l.Epoch, fmt.Sprintf(format, args...))
}
