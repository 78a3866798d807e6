package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/metrics"
	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/sealing"
	"fencecheck/goworker/internal/tool"
)

// The built-in agent workflow, a refund, so experiments have real work:
//
//	plan -> lookup -> create_label (tool call) -> notify -> [work_1..n] -> finish
//
// Every step ends in a protected write; the tool step goes intent (Tx1,
// prepared) -> dispatch claim -> tool call -> result (Tx2) and, after a
// takeover, resumes from whatever the ledger says with the same
// operation_id. Invariants: the execution context is checked before every
// step and every side effect; a lost lease ends the execution with no
// further write; a tool outcome nothing automatic can learn freezes the run
// in doubt; a permanent error (the tool refused for good, the attempt
// budget is spent) pauses the run for a human; a step's effect is planned
// again, under the next effect_version, only when every earlier version is
// definitely without effect, with the request as it is now (an operator's
// supplement changes it). Run input (optional): tool, extra_steps,
// step_delay_ms, order_id, amount; sensitive fields travel sealed.

var errDraining = errors.New("draining: SIGTERM")

// Execution runs one run under one lease until it ends, freezes or loses it.
type Execution struct {
	rt                 *Runtime
	lease              protocol.Lease
	ctx                context.Context
	revision           int64
	input              map[string]any
	attempts, maxTries int32 // the run's attempt_count and max_attempts
	draining           *atomic.Bool
}

var opNames = map[string]string{"start": "start", "checkpoint": "save_checkpoint", "intent": "register_intent",
	"tool_result": "tool_result", "succeed": "complete", "fail": "fail", "freeze": "freeze", "requeue": "requeue",
	"pause_human": "pause_human"}

func asInt(v any) int {
	switch x := v.(type) {
	case json.Number:
		n, _ := x.Int64()
		return int(n)
	case int:
		return x
	case float64:
		return int(x)
	}
	return 0
}

func initialState(input map[string]any) map[string]any {
	plan := []any{"plan", "lookup", "create_label", "notify"}
	for i := 0; i < asInt(input["extra_steps"]); i++ {
		plan = append(plan, "work_"+strconv.Itoa(i+1))
	}
	plan = append(plan, "finish")
	orderID, ok := input["order_id"]
	if !ok {
		orderID = "order-1"
	}
	amount, ok := input["amount"]
	if !ok {
		amount = 10
	}
	data := map[string]any{"order_id": orderID, "amount": amount}
	for k := range sealing.Sensitive { // as stored: sealed
		if v, ok := input[k]; ok {
			data[k] = v
		}
	}
	return map[string]any{"workflow": "refund", "plan": plan, "cursor": 0,
		"data": data, "results": map[string]any{}, "pending": nil}
}

func copyMap(m any) map[string]any {
	out := map[string]any{}
	if src, ok := m.(map[string]any); ok {
		for k, v := range src {
			out[k] = v
		}
	}
	return out
}

// Run returns the run's status when this execution ends.
func (x *Execution) Run() (string, error) {
	conn, err := x.rt.Main.Conn(x.ctx)
	if err != nil {
		return "", err
	}
	st, err := x.rt.P.RunState(x.ctx, conn, x.lease.RunID)
	if err != nil {
		return "", x.rt.Main.Check(err)
	}
	x.revision, x.input, x.attempts, x.maxTries = st.Revision, st.Input, st.Attempts, st.MaxAttempts
	ck, err := x.rt.P.ReadCheckpoint(x.ctx, conn, x.lease.RunID)
	if err != nil {
		if errors.Is(err, protocol.ErrSchemaVersionUnknown) || errors.Is(err, protocol.ErrCheckpointCorrupt) {
			metrics.Inc(metrics.Migrations, "refused")
			metrics.Inc(metrics.MigrationFailures)
		}
		return "", x.rt.Main.Check(err)
	}
	if ck != nil && ck.MigratedFrom != 0 {
		metrics.Inc(metrics.Migrations, "migrated")
		logf(x.lease, "checkpoint migrated from schema version %d to %d", ck.MigratedFrom, protocol.CurrentSchemaVersion)
	}
	var state map[string]any
	if ck == nil {
		state = initialState(x.input)
		if _, err := x.write("start", state, "plan", "agent.started", nil, nil, ""); err != nil {
			return "", err
		}
	} else {
		state = ck.State
		if err := protocol.ValidateV2(state); err != nil {
			return "", err
		}
	}
	delay := time.Duration(asInt(x.input["step_delay_ms"])) * time.Millisecond
	for {
		plan, _ := state["plan"].([]any)
		cursor := asInt(state["cursor"])
		if cursor >= len(plan) {
			// The plan is done but the run is not: a state saved by another
			// writer, or a migrated one listing every step done. The run ends
			// only by its own write; answering "succeeded" without it would
			// leave it held.
			out, err := x.write("succeed", state, "finish", "agent.succeeded", nil, map[string]any{"reason": "done"}, "")
			if err != nil {
				return "", err
			}
			return out.Status, nil
		}
		if x.ctx.Err() != nil {
			return "", protocol.Cancelled(x.ctx)
		}
		if x.draining.Load() {
			return "", errDraining
		}
		step := fmt.Sprint(plan[cursor])
		if delay > 0 {
			if err := x.sleep(delay); err != nil {
				return "", err
			}
		}
		switch step {
		case "create_label":
			status, err := x.toolStep(state, step)
			if err != nil || status != "" {
				return status, err
			}
		case "finish":
			done := copyMap(state)
			done["cursor"] = cursor + 1
			out, err := x.write("succeed", done, step, "agent.succeeded", nil, map[string]any{"reason": "done"}, "")
			if err != nil {
				return "", err
			}
			return out.Status, nil
		default:
			if state, err = x.plainStep(state, step, cursor); err != nil {
				return "", err
			}
		}
	}
}

func (x *Execution) sleep(d time.Duration) error {
	select {
	case <-x.ctx.Done():
		return protocol.Cancelled(x.ctx)
	case <-time.After(d):
		return nil
	}
}

func (x *Execution) plainStep(state map[string]any, step string, cursor int) (map[string]any, error) {
	data := copyMap(state["data"])
	switch step {
	case "lookup":
		data["refundable"] = true
	case "plan":
		data["plan_ok"] = true
	}
	results := copyMap(state["results"])
	results[step] = "done"
	next := copyMap(state)
	next["data"], next["results"], next["cursor"] = data, results, cursor+1
	eventType := "agent.checkpoint"
	if step == "notify" {
		eventType = "refund.notified"
	}
	_, err := x.write("checkpoint", next, step, eventType, nil, nil, "")
	return next, err
}

// toolStep advances the tool step by what the ledger says: "" when the step
// is done and the workflow goes on, else the status this execution ends with.
func (x *Execution) toolStep(state map[string]any, step string) (string, error) {
	rt, conn := x.rt, x.rt.Main
	toolName, _ := x.input["tool"].(string)
	if toolName == "" {
		toolName = "idem"
	}
	request := rt.P.Request(state, x.input)
	version, err := x.effectVersion(step)
	if err != nil {
		return "", err
	}
	opID := rt.P.OperationID(rt.S.Tenant, x.lease.RunID, step, version)
	for i := 0; i < 10000; i++ {
		if x.ctx.Err() != nil {
			return "", protocol.Cancelled(x.ctx)
		}
		c, err := conn.Conn(x.ctx)
		if err != nil {
			return "", err
		}
		row, err := rt.P.GetOperation(x.ctx, c, opID)
		if err != nil {
			return "", conn.Check(err)
		}
		if row == nil {
			capability, err := rt.Tools.Capability(toolName)
			if err != nil {
				return "", err
			}
			retention, err := rt.Tools.RetentionMS(toolName)
			if err != nil {
				return "", err
			}
			opened, err := rt.Seal.Open(request) // the digest is over what the tool receives
			if err != nil {
				return "", err
			}
			digest, err := protocol.RequestDigest(opened)
			if err != nil {
				return "", err
			}
			state["pending"] = map[string]any{"operation_id": opID, "tool": toolName, "step": step}
			effect := &protocol.Effect{OperationID: opID, StepID: step, EffectVersion: version, Tool: toolName,
				Capability: capability, Digest: digest, Request: request, RetentionMS: retention}
			if _, err := x.write("intent", state, step, "agent.tool_intent", effect, nil, opID); err != nil {
				return "", err
			}
			injection.Point("after_outbound_intent_commit", x.lease.RunID, &x.lease.Epoch, &x.revision, opID)
			continue
		}
		stale, err := x.plannedBeforeSupplement(row, request)
		if err != nil {
			return "", err
		}
		if stale {
			// Planned before a person's supplement changed the request:
			// never sent as it is (V[supplement_after_budget]); retired
			// unsent, so the next pass plans the next version with it.
			if err := x.retireUnsent(opID); err != nil {
				return "", err
			}
			continue
		}
		switch row.Status {
		case "prepared":
			status, done, err := x.dispatchOwn(state, step, opID)
			if err != nil || done {
				return status, err
			}
		case "dispatching":
			if row.ClaimExpired {
				expired, err := rt.P.ExpireClaims(x.ctx, c)
				if err != nil {
					return "", conn.Check(err)
				}
				if len(expired) == 0 {
					// Its row is locked by another session (the expiry skips
					// locked rows): wait for it, never spin.
					if err := x.sleep(100 * time.Millisecond); err != nil {
						return "", err
					}
				}
			} else if err := x.sleep(100 * time.Millisecond); err != nil { // a live claim: its answer may come
				return "", err
			}
		case "unknown":
			u := protocol.UnknownOp{OperationID: opID, RunID: x.lease.RunID, Tool: row.Tool, Capability: row.Capability,
				Digest: row.Digest, Revision: row.Revision, RunStatus: "running"}
			change, err := rt.Recon.ReconcileOne(x.ctx, c, u)
			if protocol.ClassOf(err) == "LedgerConflict" {
				// Another reconciler, a person or a callback settled it
				// first: go on from what the ledger says now.
				continue
			}
			if err != nil {
				return "", conn.Check(err)
			}
			if change == nil || change.To == "unknown" {
				status, err := x.freeze(state, step, opID, nil, map[string]any{"reason": "unresolved"})
				if protocol.ClassOf(err) == "LedgerConflict" {
					// It converged since we read it: the freeze rolled back;
					// go on from what the ledger says.
					continue
				}
				return status, err
			}
		case "succeeded":
			return x.finishTool(state, step, opID, row.Status, &protocol.Effect{Mode: "adopt", RemoteID: row.RemoteID})
		case "failed_final":
			if row.RefusedByTool() && !pausedFor(state, step, opID) {
				// The tool refused it for good and nobody paused the run for
				// it (its worker died between recording the refusal and the
				// pause, or another dispatcher recorded it): only a person
				// may move a refused step on.
				return x.finishTool(state, step, opID, row.Status, &protocol.Effect{Mode: "adopt"})
			}
			// Definitely not executed (refused and decided on, or found not
			// executed): the effect is planned again as the next version.
			version++
			opID = rt.P.OperationID(rt.S.Tenant, x.lease.RunID, step, version)
		default: // cancelled: the run was cancelled under us
			return "", &protocol.Error{Class: "LeaseLost", Reason: "cancelled", Msg: "operation " + opID + " is " + row.Status}
		}
	}
	return "", fmt.Errorf("tool step %s did not converge", step)
}

// plannedBeforeSupplement: a prepared intent whose request is not the one
// the run would send now (a person's supplement changed it since).
func (x *Execution) plannedBeforeSupplement(row *protocol.OperationRow, request any) (bool, error) {
	if row.Status != "prepared" {
		return false, nil
	}
	opened, err := x.rt.Seal.Open(request)
	if err != nil {
		return false, err
	}
	digest, err := protocol.RequestDigest(opened)
	return err == nil && digest != row.Digest, err
}

// retireUnsent claims our prepared intent and records it failed_final
// without sending it: definitely not executed (it was only ever refused
// with a 429, the tool's proof it did not act), so a version with the
// supplied fields may follow.
func (x *Execution) retireUnsent(opID string) error {
	rt := x.rt
	c, err := rt.Main.Conn(x.ctx)
	if err != nil {
		return err
	}
	op, err := rt.P.DispatchClaim(x.ctx, c, rt.S.Owner(), rt.S.DispatchTTLMS, &opID)
	if err != nil {
		return rt.Main.Check(err)
	}
	if op == nil {
		return x.sleep(100 * time.Millisecond) // claimed by someone else meanwhile
	}
	why := map[string]any{"executed": false, "reason": "superseded by a person's supplement, never sent"}
	return rt.Main.Check(rt.P.RecordResult(x.ctx, c, op, rt.S.Owner(), tool.Answer{Kind: "failed_final", Result: why}))
}

// dispatchOwn claims and sends our prepared intent; done when this call
// decided how the execution (or the step) continues.
func (x *Execution) dispatchOwn(state map[string]any, step, opID string) (string, bool, error) {
	rt := x.rt
	c, err := rt.Main.Conn(x.ctx)
	if err != nil {
		return "", true, err
	}
	op, err := rt.P.DispatchClaim(x.ctx, c, rt.S.Owner(), rt.S.DispatchTTLMS, &opID)
	if err != nil {
		return "", true, rt.Main.Check(err)
	}
	if op == nil {
		return "", false, x.sleep(100 * time.Millisecond) // claimed by someone else, or forbidden
	}
	a, err := rt.Disp.Send(x.ctx, op, op.RunEpoch)
	if err != nil {
		return "", true, err
	}
	if a.Kind == "succeeded" || a.Kind == "failed_final" {
		effect := &protocol.Effect{Mode: "record", Outcome: a.Kind, DispatchOwner: rt.S.Owner(),
			LedgerRevision: op.Revision, Digest: op.Digest, RemoteID: a.RemoteID, Result: a.Result}
		status, err := x.finishTool(state, step, opID, a.Kind, effect)
		if errors.Is(err, protocol.ErrLeaseLost) {
			// Keep the answer as a ledger fact matching our claim, so the
			// successor adopts it instead of asking again.
			if c, cerr := rt.Main.Conn(context.Background()); cerr == nil {
				_ = rt.P.RecordResult(context.Background(), c, op, rt.S.Owner(), a)
			}
		}
		if errors.Is(err, protocol.ErrLedgerConflict) {
			// Our claim no longer matches: the operation moved while we held
			// the answer (a callback converged it, or the claim expired and
			// turned unknown). The whole write rolled back; the loop goes on
			// from what the ledger says now, never from our copy.
			return "", false, nil
		}
		return status, true, err
	}
	to, err := rt.P.SettleWithoutResult(x.ctx, c, op, rt.S.Owner(), a)
	if err != nil {
		return "", true, rt.Main.Check(err)
	}
	if to == "unknown" {
		metrics.Inc(metrics.ToolUnknown)
		metrics.Inc(metrics.ToolUnknownResult)
	}
	if a.Kind == "rejected_retryable" {
		status, err := x.requeue(state, step, "tool_rejected_retryable")
		return status, true, err
	}
	return "", false, nil // unknown: the loop reconciles it
}

// effectVersion is the step's current effect version: the newest one in the
// ledger (1 when none yet).
func (x *Execution) effectVersion(step string) (int, error) {
	c, err := x.rt.Main.Conn(x.ctx)
	if err != nil {
		return 0, err
	}
	var version int
	err = c.QueryRow(x.ctx, x.rt.P.SQL.StepVersions, x.lease.RunID, step).Scan(&version, new(string))
	if errors.Is(err, pgx.ErrNoRows) {
		return 1, nil
	}
	return version, x.rt.Main.Check(err)
}

// requeue goes back to the queue after a transient error, with exponential
// backoff and jitter (Protocol.Backoff); a spent attempt budget is a
// permanent error: paused for a human instead (Chinese seed section 10).
func (x *Execution) requeue(state map[string]any, step, reason string) (string, error) {
	if x.rt.P.BudgetSpent(x.attempts, x.maxTries) {
		return x.pause(state, step, map[string]any{"reason": "attempts_exhausted", "after": reason})
	}
	delay := x.rt.P.Backoff(x.lease.RunID, int(x.attempts))
	out, err := x.writeWith("requeue", state, step, "agent.requeued", nil,
		map[string]any{"reason": reason, "attempt": x.attempts, "backoff_ms": delay}, "", delay)
	if err != nil {
		return "", err
	}
	return out.Status, nil
}

// pause pauses the run for a human: approve, supplement or terminate
// (Chinese seed sections 3.1, 10; the operator's decide).
func (x *Execution) pause(state map[string]any, step string, payload map[string]any) (string, error) {
	return x.end("pause_human", state, step, payload)
}

// end is a protected write that gives the lease up (pause_human, fail);
// the status the run is left in.
func (x *Execution) end(transition string, state map[string]any, step string, payload map[string]any) (string, error) {
	event := map[string]string{"pause_human": "agent.paused_human", "fail": "agent.failed"}[transition]
	out, err := x.write(transition, state, step, event, nil, payload, "")
	if err != nil {
		return "", err
	}
	if out.Status == "paused_human" {
		metrics.Inc(metrics.RunsPaused, out.Status, fmt.Sprint(payload["reason"]))
	}
	return out.Status, nil
}

func (x *Execution) finishTool(state map[string]any, step, opID, outcome string, effect *protocol.Effect) (string, error) {
	effect.OperationID = opID
	results := copyMap(state["results"])
	results[step] = map[string]any{"operation_id": opID, "outcome": outcome, "remote_id": effect.RemoteID}
	next := copyMap(state)
	// A refused effect does not complete the step: it is planned again (the
	// next version) once a person approved or supplemented it.
	cursor := asInt(state["cursor"])
	if outcome == "succeeded" {
		cursor++
	}
	next["results"], next["pending"], next["cursor"] = results, nil, cursor
	if _, err := x.write("tool_result", next, step, "agent.tool_result", effect, nil, opID); err != nil {
		return "", err
	}
	for k := range state {
		delete(state, k)
	}
	for k, v := range next {
		state[k] = v
	}
	if outcome == "failed_final" {
		// A permanent error (Chinese seed section 10): a person decides. The
		// pause marks the refusal it was for: a run that leaves this pause
		// was moved on by a person's decision.
		marked := copyMap(results[step])
		marked[pausedForPerson] = true
		results[step] = marked
		return x.end(x.rt.P.OnRefusal, state, step, map[string]any{"reason": "tool_rejected"})
	}
	return "", nil
}

// pausedForPerson marks a step's refused result once the run was paused for
// a person over it.
const pausedForPerson = "paused_for_person"

// pausedFor: the run was paused for a person over this refused operation.
func pausedFor(state map[string]any, step, opID string) bool {
	done, ok := copyMap(state["results"])[step].(map[string]any)
	return ok && done["operation_id"] == opID && done[pausedForPerson] == true
}

// freeze pauses the run in doubt: nothing automatic can learn what the tool did.
func (x *Execution) freeze(state map[string]any, step, opID string, claim *protocol.Operation, why map[string]any) (string, error) {
	effect := &protocol.Effect{OperationID: opID, Error: why}
	if claim != nil {
		effect.DispatchOwner, effect.LedgerRevision = x.rt.S.Owner(), claim.Revision
	}
	_, err := x.write("freeze", state, step, "agent.tool_in_doubt", effect,
		map[string]any{"reason": "tool_outcome_unknown"}, opID)
	if err != nil {
		return "", err
	}
	metrics.Inc(metrics.RunsPaused, "paused_indoubt", "tool_outcome_unknown")
	return "paused_indoubt", nil
}

func (x *Execution) write(transition string, state map[string]any, step, eventType string,
	effect *protocol.Effect, payload map[string]any, opID string) (*protocol.Written, error) {
	return x.writeWith(transition, state, step, eventType, effect, payload, opID, 0)
}

func (x *Execution) writeWith(transition string, state map[string]any, step, eventType string,
	effect *protocol.Effect, payload map[string]any, opID string, backoffMS int64) (*protocol.Written, error) {
	if x.ctx.Err() != nil {
		return nil, protocol.Cancelled(x.ctx)
	}
	body := map[string]any{"tenant_id": x.rt.S.Tenant, "run_id": x.lease.RunID, "epoch": x.lease.Epoch, "step": step}
	for k, v := range payload {
		body[k] = v
	}
	s := step
	wr := &protocol.Write{Lease: x.lease, ExpectedRevision: x.revision, Transition: transition, State: state,
		SchemaVersion: protocol.CurrentSchemaVersion, EventType: eventType, Payload: body, Step: &s,
		Effect: effect, EventID: protocol.NewUUID(), BackoffMS: backoffMS}
	done := record(opNames[transition], ids{RunID: x.lease.RunID, Epoch: i64(x.lease.Epoch), Revision: i64(x.revision),
		OperationID: opID, EventID: wr.EventID}, map[string]any{"step": step})
	started := time.Now()
	out, err := x.rt.Writer.Write(x.ctx, wr)
	if err != nil {
		done(err, ids{})
		countRejected(err)
		return nil, err
	}
	metrics.Observe(metrics.CommitLatency, time.Since(started).Seconds(), transition)
	done(nil, ids{Revision: i64(out.Revision)})
	x.revision = out.Revision
	logf(x.lease, "%s committed: revision %d, status %s, event %s", transition, out.Revision, out.Status, wr.EventID)
	injection.Point("after_checkpoint_commit", x.lease.RunID, &x.lease.Epoch, &out.Revision, opID)
	return out, nil
}

// countRejected counts a protected write the database (or the lease check
// before it) refused, by reason.
func countRejected(err error) {
	reason := map[string]string{"LeaseLost": "lease", "FenceGuard": "lease", "RevisionConflict": "revision",
		"StateConflict": "state", "LedgerConflict": "ledger", "IntentConflict": "ledger"}[protocol.ClassOf(err)]
	if reason == "" {
		return
	}
	metrics.Inc(metrics.WriteRejected, reason)
	if reason == "lease" {
		metrics.Inc(metrics.StaleFence)
	}
}
