package worker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/metrics"
	"fencecheck/goworker/internal/protocol"
)

// ops mode (worker contract section 5): one JSON request per line on stdin,
// one reply per line on stdout, in order; "async": true runs on its own
// goroutine and session and answers when done. The process is one worker
// session: its owner is fixed unless an op passes "owner".

type opCtx struct {
	session *protocol.Session
	writer  *protocol.Writer
}

type handler func(c *opCtx, args map[string]any) (any, error)

type badRequest struct{ msg string }

func (b badRequest) Error() string { return b.msg }

// Ops serves one ops process.
type Ops struct {
	rt         *Runtime
	out        io.Writer
	outMu      sync.Mutex
	handlers   map[string]handler
	hbMu       sync.Mutex
	heartbeats map[string]*liveHeartbeat
}

type liveHeartbeat struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   <-chan struct{}
}

// NewOps wires the handlers.
func NewOps(rt *Runtime, out io.Writer) *Ops {
	o := &Ops{rt: rt, out: out, heartbeats: map[string]*liveHeartbeat{}}
	o.handlers = map[string]handler{
		"create_run": o.createRun, "retry_run": o.retryRun, "claim": o.claim, "renew": o.renew,
		"release": o.release, "save_checkpoint": o.saveCheckpoint, "register_intent": o.registerIntent,
		"dispatch": o.dispatch, "reconcile": o.reconcile, "cancel": o.cancel, "complete": o.complete,
		"deliver_callback": o.deliverCallback, "relay": o.relay, "consume": o.consume,
		"read_checkpoint": o.readCheckpoint, "durability": o.durability, "heartbeat": o.heartbeat,
		"run_state": o.runState, "legacy_checkpoint": o.legacyCheckpoint,
		"resolve_indoubt": o.resolveInDoubt, "decide": o.decide, "purge": o.purge, "converge_operation": o.convergeOperation,
		"list_paused": o.listPaused, "operator_actions": o.operatorActions,
	}
	return o
}

// Serve reads requests until stdin closes; 0.
func (o *Ops) Serve(in io.Reader) int {
	var wg sync.WaitGroup
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	main := &opCtx{o.rt.Main, o.rt.Writer}
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		v, err := protocol.Decode(line)
		req, ok := v.(map[string]any)
		if err != nil || !ok {
			o.reply(map[string]any{"id": nil, "ok": false, "error": "BadRequest", "message": "a request is a JSON object"})
			continue
		}
		if async, _ := req["async"].(bool); async {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := o.rt.NewSession()
				defer s.Close()
				o.reply(o.handle(&opCtx{s, o.rt.NewWriter(s)}, req))
			}()
			continue
		}
		o.reply(o.handle(main, req))
	}
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
	}
	o.hbMu.Lock()
	for _, hb := range o.heartbeats {
		hb.cancel(errFinished)
	}
	o.hbMu.Unlock()
	return 0
}

func (o *Ops) reply(r map[string]any) {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"id": r["id"], "ok": false, "error": "EncodingError", "message": err.Error()})
	}
	o.outMu.Lock()
	defer o.outMu.Unlock()
	_, _ = o.out.Write(append(b, '\n'))
}

func (o *Ops) handle(c *opCtx, req map[string]any) (reply map[string]any) {
	id := req["id"]
	op, _ := req["op"].(string)
	args, _ := req["args"].(map[string]any)
	if args == nil {
		args = map[string]any{}
	}
	h, ok := o.handlers[op]
	if !ok {
		return map[string]any{"id": id, "ok": false, "error": "Unsupported", "message": fmt.Sprintf("no op %q", op)}
	}
	defer func() {
		if p := recover(); p != nil {
			reply = map[string]any{"id": id, "ok": false, "error": "BadRequest", "message": fmt.Sprint(p)}
		}
	}()
	result, err := h(c, args)
	if err == nil {
		return map[string]any{"id": id, "ok": true, "result": result}
	}
	err = protocol.FromDatabase(err)
	var pe *protocol.Error
	var br badRequest
	switch {
	case errors.As(err, &pe):
		return map[string]any{"id": id, "ok": false, "error": pe.Class, "message": pe.Error(), "reason": pe.Reason}
	case errors.As(err, &br):
		return map[string]any{"id": id, "ok": false, "error": "BadRequest", "message": br.msg}
	case protocol.SQLState(err) != "":
		return map[string]any{"id": id, "ok": false, "error": "DatabaseError", "message": err.Error(), "sqlstate": protocol.SQLState(err)}
	}
	fmt.Fprintf(os.Stderr, "op %s failed: %v\n", op, err)
	return map[string]any{"id": id, "ok": false, "error": protocol.ClassOf(err), "message": err.Error()}
}

// ------------------------------------------------------------ arguments

func str(args map[string]any, key string) string {
	v, ok := args[key]
	if !ok || v == nil {
		panic(fmt.Sprintf("missing argument %q", key))
	}
	return fmt.Sprint(v)
}

func optStr(args map[string]any, key, def string) string {
	if v, ok := args[key]; ok && v != nil && fmt.Sprint(v) != "" {
		return fmt.Sprint(v)
	}
	return def
}

func num(args map[string]any, key string, def *int64) int64 {
	v, ok := args[key]
	if !ok || v == nil {
		if def == nil {
			panic(fmt.Sprintf("missing argument %q", key))
		}
		return *def
	}
	n, err := v.(json.Number).Int64()
	if err != nil {
		panic(fmt.Sprintf("argument %q must be an integer", key))
	}
	return n
}

// optPtr is an optional string argument (nil when absent or null).
func optPtr(args map[string]any, key string) *string {
	if v, ok := args[key]; ok && v != nil {
		s := fmt.Sprint(v)
		return &s
	}
	return nil
}

func uuidArg(args map[string]any, key string) string {
	s := str(args, key)
	if !protocol.ValidUUID(s) {
		panic(fmt.Sprintf("argument %q must be a UUID, got %q", key, s))
	}
	return s
}

func (o *Ops) lease(args map[string]any) protocol.Lease {
	return protocol.Lease{RunID: uuidArg(args, "run_id"), Owner: optStr(args, "owner", o.rt.S.Owner()), Epoch: num(args, "epoch", nil)}
}

// hbKey names a lease whole: a heartbeat started under another owner at the
// same epoch (refused by the database) must not replace the holder's.
func hbKey(l protocol.Lease) string { return fmt.Sprintf("%s/%s/%d", l.RunID, l.Owner, l.Epoch) }

// checkNotCancelled: a lease whose heartbeat found it unconfirmed starts no new write.
func (o *Ops) checkNotCancelled(l protocol.Lease) error {
	o.hbMu.Lock()
	hb := o.heartbeats[hbKey(l)]
	o.hbMu.Unlock()
	if hb != nil && hb.ctx.Err() != nil && !errors.Is(context.Cause(hb.ctx), errFinished) {
		return protocol.Cancelled(hb.ctx)
	}
	return nil
}

func (c *opCtx) conn() (protocol.DB, error) {
	conn, err := c.session.Conn(context.Background())
	if err != nil {
		return nil, err
	}
	return conn, nil
}

func (o *Ops) payload(l protocol.Lease, extra map[string]any) map[string]any {
	p := map[string]any{"tenant_id": o.rt.S.Tenant, "run_id": l.RunID, "epoch": l.Epoch}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

func (o *Ops) currentState(ctx context.Context, db protocol.DB, runID string) map[string]any {
	state, _ := o.rt.P.LatestState(ctx, db, runID)
	return copyMap(state)
}

func (o *Ops) write(c *opCtx, op string, wr *protocol.Write, opID string) (*protocol.Written, error) {
	if wr.EventID == "" {
		wr.EventID = protocol.NewUUID()
	}
	done := record(op, ids{RunID: wr.Lease.RunID, Epoch: i64(wr.Lease.Epoch), Revision: i64(wr.ExpectedRevision),
		OperationID: opID, EventID: wr.EventID}, nil)
	out, err := c.writer.Write(context.Background(), wr)
	if err != nil {
		done(err, ids{})
		return nil, err
	}
	done(nil, ids{Revision: i64(out.Revision)})
	return out, nil
}

// ------------------------------------------------------------ ops

func (o *Ops) createRun(c *opCtx, args map[string]any) (any, error) {
	tenant := o.rt.S.Tenant
	if t := optStr(args, "tenant_id", ""); t != "" && t != tenant {
		// The tenant is the login role's binding (contract section 7): one
		// session never acts for another tenant.
		return nil, badRequest{fmt.Sprintf("this session is bound to tenant %s; a run of tenant %s needs a login "+
			"role bound to that tenant", tenant, t)}
	}
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	taskID := str(args, "task_id")
	// A JSON object, or none (null or absent: {}); a list or a string is no
	// run's input and is refused, never taken for an empty one (X).
	input, isObject := args["input"].(map[string]any)
	if raw, given := args["input"]; given && raw != nil && !isObject {
		return nil, badRequest{fmt.Sprintf("input must be a JSON object, not %T", raw)}
	}
	if input == nil {
		input = map[string]any{}
	}
	sealed, err := o.rt.Seal.Seal(input)
	if err != nil {
		return nil, protocol.SensitiveErr(err)
	}
	maxAttempts := int64(12)
	done := record("create_run", ids{}, map[string]any{"task_id": taskID})
	runID, err := o.rt.P.CreateRun(context.Background(), db, tenant, taskID, sealed, int(num(args, "max_attempts", &maxAttempts)))
	done(err, ids{RunID: runID})
	if err != nil {
		return nil, c.session.Check(err)
	}
	return map[string]any{"run_id": runID, "task_id": taskID}, nil
}

func (o *Ops) retryRun(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	taskID := str(args, "task_id")
	done := record("retry_run", ids{}, map[string]any{"task_id": taskID})
	runID, old, err := o.rt.P.RetryRun(context.Background(), db, taskID)
	done(err, ids{RunID: runID})
	if err != nil {
		return nil, c.session.Check(err)
	}
	return map[string]any{"run_id": runID, "task_id": taskID, "retry_of": old}, nil
}

func (o *Ops) claim(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	owner := optStr(args, "owner", o.rt.S.Owner())
	ttl := num(args, "ttl_ms", &o.rt.S.LeaseTTLMS)
	runID := ""
	if args["run_id"] != nil {
		runID = uuidArg(args, "run_id")
	}
	done := record("claim", ids{RunID: runID}, map[string]any{"owner": owner})
	var claim *protocol.Claim
	why := "none"
	if runID == "" {
		claim, err = o.rt.P.ClaimRun(context.Background(), db, owner, ttl)
	} else {
		claim, why, err = o.rt.P.Takeover(context.Background(), db, runID, owner, ttl)
	}
	if err == nil && claim == nil {
		err = &protocol.Error{Class: "NotClaimable", Reason: why, Msg: "not claimable: " + why}
	}
	if err != nil {
		done(err, ids{})
		return nil, c.session.Check(err)
	}
	done(nil, ids{RunID: claim.RunID, Epoch: i64(claim.Epoch), Revision: i64(claim.Revision)})
	return map[string]any{"run_id": claim.RunID, "epoch": claim.Epoch, "revision": claim.Revision,
		"status": claim.Status, "owner": claim.Owner, "lease_expires_at": claim.ExpiresAt, "lock_wait_ms": nil}, nil
}

func (o *Ops) renew(c *opCtx, args map[string]any) (any, error) {
	l := o.lease(args)
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	done := record("renew", ids{RunID: l.RunID, Epoch: i64(l.Epoch)}, nil)
	expires, err := o.rt.P.Renew(context.Background(), db, l, num(args, "ttl_ms", &o.rt.S.LeaseTTLMS))
	done(err, ids{})
	if err != nil {
		return nil, c.session.Check(err)
	}
	return map[string]any{"expires_at": expires}, nil
}

func (o *Ops) release(c *opCtx, args map[string]any) (any, error) {
	l := o.lease(args)
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	done := record("release", ids{RunID: l.RunID, Epoch: i64(l.Epoch)}, nil)
	err = o.rt.P.Release(context.Background(), db, l)
	done(err, ids{})
	if err != nil {
		return nil, c.session.Check(err)
	}
	return map[string]any{}, nil
}

func (o *Ops) saveCheckpoint(c *opCtx, args map[string]any) (any, error) {
	l := o.lease(args)
	if err := o.checkNotCancelled(l); err != nil {
		return nil, err
	}
	state, ok := args["state"].(map[string]any)
	if !ok {
		return nil, badRequest{"state must be a JSON object"}
	}
	current := int64(protocol.CurrentSchemaVersion)
	var step *string
	if s := optStr(args, "step", ""); s != "" {
		step = &s
	}
	wr := &protocol.Write{Lease: l, ExpectedRevision: num(args, "expected_revision", nil), Transition: "checkpoint",
		State: state, SchemaVersion: int(num(args, "schema_version", &current)), EventType: "agent.checkpoint",
		Payload: o.payload(l, nil), Step: step, EventID: optStr(args, "event_id", "")}
	out, err := o.write(c, "save_checkpoint", wr, "")
	if err != nil {
		return nil, err
	}
	return map[string]any{"revision": out.Revision, "event_id": out.EventID, "read_back": out.ReadBack}, nil
}

func (o *Ops) registerIntent(c *opCtx, args map[string]any) (any, error) {
	l := o.lease(args)
	if err := o.checkNotCancelled(l); err != nil {
		return nil, err
	}
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	one := int64(1)
	step, version, toolName := str(args, "step_id"), int(num(args, "effect_version", &one)), str(args, "tool")
	opID := o.rt.P.OperationID(o.rt.S.Tenant, l.RunID, step, version)
	capability := optStr(args, "capability", "")
	if capability == "" {
		if capability, err = o.rt.Tools.Capability(toolName); err != nil {
			return nil, badRequest{err.Error()}
		}
	}
	request, ok := args["request"].(map[string]any)
	if !ok {
		return nil, badRequest{"request must be a JSON object"}
	}
	digest, err := protocol.RequestDigest(request)
	if err != nil {
		return nil, err
	}
	// How long the tool keeps our key, as the workflow records it: a same-key
	// resend's claim must end within it (ClaimRetry).
	retention, err := o.rt.Tools.RetentionMS(toolName)
	if err != nil {
		return nil, err
	}
	state := o.currentState(context.Background(), db, l.RunID)
	state["pending"] = map[string]any{"operation_id": opID, "tool": toolName, "step": step}
	wr := &protocol.Write{Lease: l, ExpectedRevision: num(args, "expected_revision", nil), Transition: "intent",
		State: state, SchemaVersion: protocol.CurrentSchemaVersion, EventType: "agent.tool_intent",
		Payload: o.payload(l, map[string]any{"step": step}), Step: &step,
		Effect: &protocol.Effect{OperationID: opID, StepID: step, EffectVersion: version, Tool: toolName,
			Capability: capability, Digest: digest, Request: request, RetentionMS: retention}}
	out, err := o.write(c, "register_intent", wr, opID)
	if err != nil {
		return nil, err
	}
	injection.Point("after_outbound_intent_commit", l.RunID, &l.Epoch, &out.Revision, opID)
	return map[string]any{"operation_id": opID, "revision": out.Revision, "ledger_status": out.LedgerStatus}, nil
}

func (o *Ops) dispatch(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	var opID *string
	if s := optStr(args, "operation_id", ""); s != "" {
		opID = &s
	}
	done := record("dispatch", ids{}, nil)
	res, err := o.rt.Disp.Cycle(context.Background(), db, o.rt.S.DispatchTTLMS, opID)
	done(err, ids{})
	return res, c.session.Check(err)
}

func (o *Ops) reconcile(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	done := record("reconcile", ids{}, nil)
	changes, err := o.rt.Recon.Cycle(context.Background(), db)
	done(err, ids{})
	if changes == nil {
		changes = []protocol.Change{}
	}
	return map[string]any{"changes": changes}, c.session.Check(err)
}

func (o *Ops) cancel(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	runID := uuidArg(args, "run_id")
	done := record("cancel", ids{RunID: runID}, nil)
	out, err := o.rt.P.Cancel(context.Background(), db, runID, optStr(args, "reason", "cancelled"), optPtr(args, "ticket"))
	done(err, ids{})
	countDecision("cancel", err)
	return out, c.session.Check(err)
}

// resolveInDoubt is taken in steps: the run's row lock, the point
// after_operator_lock (a racing takeover waits meanwhile), the decision.
func (o *Ops) resolveInDoubt(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	runID, opID := uuidArg(args, "run_id"), str(args, "operation_id")
	done := record("resolve_indoubt", ids{RunID: runID, OperationID: opID}, nil)
	out, err := o.rt.P.Resolve(context.Background(), db, runID, opID, str(args, "decision"), optPtr(args, "remote_id"),
		str(args, "reason"), optPtr(args, "ticket"), func() {
			injection.Point("after_operator_lock", runID, nil, nil, opID)
		})
	done(err, ids{})
	countDecision("resolve", err)
	return out, c.session.Check(err)
}

func (o *Ops) decide(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	runID, decision := uuidArg(args, "run_id"), str(args, "decision")
	var supplement []byte
	if s, ok := args["supplement"].(map[string]any); ok {
		sealed, err := o.rt.Seal.Seal(s)
		if err != nil {
			return nil, protocol.SensitiveErr(err)
		}
		if supplement, err = protocol.Canonical(sealed); err != nil {
			return nil, err
		}
	}
	done := record("decide", ids{RunID: runID}, map[string]any{"decision": decision})
	out, err := o.rt.P.Decide(context.Background(), db, runID, decision, supplement, str(args, "reason"), optPtr(args, "ticket"))
	done(err, ids{})
	countDecision(decision, err)
	return out, c.session.Check(err)
}

// purge is retention: archive, then delete, old finished tasks of the
// tenant (protocol.Purge); archive names the file the documents are
// appended to and synced in, before the deletion commits.
func (o *Ops) purge(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	defLimit := int64(100)
	olderThan, limit := num(args, "older_than_ms", nil), num(args, "limit", &defLimit)
	archive := optStr(args, "archive", "")
	done := record("purge", ids{}, map[string]any{"older_than_ms": olderThan, "limit": limit})
	out, err := o.rt.P.Purge(context.Background(), db, olderThan, limit, str(args, "reason"), optPtr(args, "ticket"), archive)
	done(err, ids{})
	countDecision("purge", err)
	return out, c.session.Check(err)
}

func (o *Ops) convergeOperation(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	opID := str(args, "operation_id")
	done := record("converge_operation", ids{OperationID: opID}, nil)
	out, err := o.rt.P.ConvergeOperation(context.Background(), db, opID, str(args, "outcome"), optPtr(args, "remote_id"),
		str(args, "reason"), optPtr(args, "ticket"))
	done(err, ids{})
	countDecision("converge", err)
	return out, c.session.Check(err)
}

func (o *Ops) listPaused(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	runs, err := o.rt.P.Paused(context.Background(), db)
	return map[string]any{"runs": runs}, c.session.Check(err)
}

func (o *Ops) operatorActions(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	actions, err := o.rt.P.Actions(context.Background(), db, uuidArg(args, "run_id"))
	return map[string]any{"actions": actions}, c.session.Check(err)
}

func countDecision(action string, err error) {
	if err == nil {
		metrics.Inc(metrics.OperatorActions, action)
	}
}

func (o *Ops) complete(c *opCtx, args map[string]any) (any, error) {
	l := o.lease(args)
	if err := o.checkNotCancelled(l); err != nil {
		return nil, err
	}
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	state := o.currentState(context.Background(), db, l.RunID)
	state["result"] = args["result"]
	step := "finish"
	wr := &protocol.Write{Lease: l, ExpectedRevision: num(args, "expected_revision", nil), Transition: "succeed",
		State: state, SchemaVersion: protocol.CurrentSchemaVersion, EventType: "agent.succeeded",
		Payload: o.payload(l, map[string]any{"reason": "done"}), Step: &step}
	out, err := o.write(c, "complete", wr, "")
	if err != nil {
		return nil, err
	}
	return map[string]any{"revision": out.Revision, "status": out.Status}, nil
}

func (o *Ops) deliverCallback(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	runID, opID := uuidArg(args, "run_id"), str(args, "operation_id")
	payload, _ := args["payload"].(map[string]any)
	if payload == nil {
		payload = map[string]any{}
	}
	done := record("deliver_callback", ids{RunID: runID, OperationID: opID}, nil)
	accepted, err := o.rt.P.DeliverCallback(context.Background(), db, runID, opID, payload)
	done(err, ids{})
	return map[string]any{"accepted": accepted}, c.session.Check(err)
}

func (o *Ops) relay(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	limit := int64(20)
	done := record("relay", ids{}, nil)
	published, err := o.rt.P.Relay(context.Background(), db, o.rt.Tools, int(num(args, "limit", &limit)))
	done(err, ids{})
	return map[string]any{"published": published}, c.session.Check(err)
}

func (o *Ops) consume(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	done := record("consume", ids{}, nil)
	out, err := o.rt.Cons.Cycle(context.Background(), db, optStr(args, "consumer", "notifier"))
	done(err, ids{})
	return out, c.session.Check(err)
}

func (o *Ops) readCheckpoint(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	runID := uuidArg(args, "run_id")
	done := record("read_checkpoint", ids{RunID: runID}, nil)
	ck, err := o.rt.P.ReadCheckpoint(context.Background(), db, runID)
	done(err, ids{})
	if err != nil {
		return nil, c.session.Check(err)
	}
	if ck == nil {
		return map[string]any{"revision": 0, "schema_version": nil, "state": nil}, nil
	}
	var from any
	if ck.MigratedFrom != 0 {
		from = ck.MigratedFrom
	}
	return map[string]any{"revision": ck.Revision, "schema_version": protocol.CurrentSchemaVersion, "state": ck.State,
		"stored_schema_version": ck.SchemaVersion, "migrated_from": from}, nil
}

func (o *Ops) durability(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	out, err := o.rt.P.Durability(context.Background(), db)
	return out, c.session.Check(err)
}

func (o *Ops) heartbeat(c *opCtx, args map[string]any) (any, error) {
	l := o.lease(args)
	key := hbKey(l)
	action := optStr(args, "action", "start")
	// Refused before anything changes: a bad action must not stop the lease's
	// running heartbeat (blind hunt 65's reader: it did, and the lease ran out).
	if action != "start" && action != "stop" {
		return nil, badRequest{"action is start or stop"}
	}
	o.hbMu.Lock()
	old := o.heartbeats[key]
	delete(o.heartbeats, key)
	o.hbMu.Unlock()
	if old != nil {
		old.cancel(errFinished)
	}
	switch action {
	case "stop":
		if old == nil {
			return map[string]any{}, nil
		}
		return map[string]any{"cancelled": !errors.Is(context.Cause(old.ctx), errFinished)}, nil
	}
	interval, timeout := num(args, "interval_ms", &o.rt.S.HeartbeatMS), num(args, "timeout_ms", &o.rt.S.HeartbeatTimeoutMS)
	if interval <= 0 {
		interval = o.rt.S.HeartbeatMS
	}
	if timeout <= 0 {
		timeout = o.rt.S.HeartbeatTimeoutMS
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	done := o.rt.StartHeartbeat(ctx, cancel, l, time.Duration(interval)*time.Millisecond, time.Duration(timeout)*time.Millisecond)
	o.hbMu.Lock()
	o.heartbeats[key] = &liveHeartbeat{ctx, cancel, done}
	o.hbMu.Unlock()
	return map[string]any{}, nil
}

// legacyCheckpoint is a version-1 checkpoint this worker migrates, with what
// the migration must keep; with plan_done, one whose every step is done (the
// old code died between its last step and the run's terminal status).
func (o *Ops) legacyCheckpoint(c *opCtx, args map[string]any) (any, error) {
	planDone := args["plan_done"] == true
	step, done := "create_label", []any{"plan", "lookup"}
	if planDone {
		step, done = "finish", []any{}
		for _, s := range protocol.DefaultPlan {
			done = append(done, s)
		}
	}
	state := map[string]any{"step": step, "done": done,
		"vars": map[string]any{"order_id": "o-legacy", "amount": json.Number("42")}}
	migrated, err := protocol.MigrateV1(state)
	if err != nil {
		return nil, err
	}
	reply := map[string]any{"schema_version": 1, "state": state, "expect": map[string]any{
		"data.order_id": "o-legacy", "data.amount": 42, "cursor": migrated["cursor"], "plan": migrated["plan"]}}
	if planDone {
		reply["plan_done"] = true
	}
	return reply, nil
}

func (o *Ops) runState(c *opCtx, args map[string]any) (any, error) {
	db, err := c.conn()
	if err != nil {
		return nil, err
	}
	r, err := o.rt.P.RunState(context.Background(), db, uuidArg(args, "run_id"))
	if err != nil {
		return nil, c.session.Check(err)
	}
	return map[string]any{"run_id": r.RunID, "task_id": r.TaskID, "status": r.Status, "revision": r.Revision,
		"owner": r.Owner, "epoch": r.Epoch, "lease_expires_at": r.LeaseExpiresAt, "current_step": r.CurrentStep,
		"checkpoint_schema_version": r.SchemaVersion, "attempt_count": r.Attempts, "max_attempts": r.MaxAttempts,
		"input": r.Input, "terminal_reason": r.Reason, "lease_live": r.LeaseLive}, nil
}
