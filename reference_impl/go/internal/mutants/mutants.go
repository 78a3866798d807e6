// Package mutants holds named, realistic Go-side bugs of this worker, each
// breaking exactly one protocol rule in exactly one place (one field of
// protocol.Protocol, or one database overlay), and naming the experiments
// expected to catch it; and the seed variants: the seeds' Go skeletons put
// back literally where this worker had to correct them
// (docs/seed-code-findings.md). Correct code never imports this package's
// choices: main selects a Protocol here, by FENCECHECK_MUTANT, once.
package mutants

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/schema"
	"fencecheck/goworker/internal/tool"
)

// Mutant is one named alteration.
type Mutant struct {
	Name        string   `json:"name"`
	Rule        int      `json:"rule"`
	Catchers    []string `json:"catchers"`
	Description string   `json:"description"`
	Alters      string   `json:"alters"`
	apply       func(p *protocol.Protocol)
	overlay     string
	// unmask: for a Go-side bug the database's protocol guard (008) would
	// refuse anyway, the part of the guard a deployment without it lacks;
	// without it the bug cannot reach the database and no experiment can
	// see it (the guard is the second line, the Go check the first).
	unmask string
}

func replace(field *string, old, new string) {
	if !strings.Contains(*field, old) {
		panic(fmt.Sprintf("mutant: %q not found in statement", old))
	}
	*field = strings.Replace(*field, old, new, 1)
}

// Registry are the mutants `fencecheck mutants` runs.
var Registry = []Mutant{
	{Name: "claim_without_skip_locked", Rule: 1, Catchers: []string{"D", "Q"}, Alters: "Statements.Claim",
		Description: "ClaimRun locks its candidate FOR UPDATE without SKIP LOCKED: it queues behind a session holding that run instead of passing it by",
		apply:       func(p *protocol.Protocol) { replace(&p.SQL.Claim, "FOR UPDATE SKIP LOCKED", "FOR UPDATE") }},
	{Name: "renew_rows_affected_ignored", Rule: 1, Catchers: []string{"K", "B"}, Alters: "Protocol.RenewConfirmed",
		Description: "Renew checks only the error of its UPDATE, not RowsAffected(): a renewal that matched no row (expired or taken over) is reported as renewed",
		apply:       func(p *protocol.Protocol) { p.RenewConfirmed = func(pgconn.CommandTag) bool { return true } }},
	{Name: "write_validation_ignored", Rule: 2, Catchers: []string{"K", "B"}, Alters: "Protocol.CheckLease",
		Description: "SaveCheckpoint locks the lease row and reads `valid` but never acts on it (the seed's `if !valid { return ErrLeaseLost }` dropped), in a deployment without the database's guard of agent_runs and agent_checkpoints",
		apply:       func(p *protocol.Protocol) { p.CheckLease = func(string, bool, bool) error { return nil } },
		unmask: `DROP TRIGGER agent_runs_guard ON public.agent_runs;
DROP TRIGGER agent_runs_write_check ON public.agent_runs;
DROP TRIGGER agent_checkpoints_guard ON public.agent_checkpoints`},
	{Name: "lease_check_separate_tx", Rule: 2, Catchers: []string{"D"}, Alters: "Protocol.LockInOwnTx",
		Description: "the lease row is locked and validated in a transaction of its own, committed before the write's begins: a takeover slips in between",
		apply:       func(p *protocol.Protocol) { p.LockInOwnTx = true }},
	{Name: "cas_without_revision", Rule: 3, Catchers: []string{"C"}, Alters: "Statements.CAS",
		Description: "the checkpoint UPDATE forgets `AND revision = $2`: two same-epoch writes with the same expected revision both commit",
		apply:       func(p *protocol.Protocol) { replace(&p.SQL.CAS, "AND revision = $2", "AND $2::bigint IS NOT NULL") }},
	{Name: "result_ignores_dispatch_claim", Rule: 4, Catchers: []string{"E"}, Alters: "Statements.RecordResult",
		Description: "the dispatcher records the tool's answer by operation_id alone, trusting that it still holds the claim",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.RecordResult, "AND status = 'dispatching'\n   AND dispatch_owner = $2 AND revision = $3 AND request_digest = $4",
				"AND $2::text IS NOT NULL AND $3::bigint IS NOT NULL AND $4::text IS NOT NULL")
		}},
	{Name: "freeze_over_converged", Rule: 4, Catchers: []string{"W"}, Alters: "Statements.FreezeLedger",
		Description: "the freeze's ledger half matches the operation whatever its status (this worker until 2026-12-02): one another reconciler converged since the workflow read it is frozen over, and the run stays paused in doubt with nothing in doubt, which nobody resumes",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.FreezeLedger, " AND status IN ('unknown', 'dispatching')", "")
		}},
	{Name: "converge_resume_apart", Rule: 4, Catchers: []string{"W"}, Alters: "Protocol.ConvergeApart",
		Description: "the reconciler converges an operation learnt by query and queues its run paused in doubt in two statements, each committed alone: one that dies between them leaves the run paused in doubt with nothing in doubt, which nobody resumes (blind bug hunt round 4, #13)",
		apply:       func(p *protocol.Protocol) { p.ConvergeApart = true }},
	{Name: "resend_after_claim_deadline", Rule: 4, Catchers: []string{"E"}, Alters: "Protocol.ResendWithoutDeadline",
		Description: "a reconciler's same-key resend claim carries no local deadline, so the call is made without checking it: frozen between that claim and its call, the reconciler sends on resume under a claim another reconciler expired and replaced (blind bug hunt round 5, #14)",
		apply:       func(p *protocol.Protocol) { p.ResendWithoutDeadline = true }},
	{Name: "claim_deadline_from_answer", Rule: 4, Catchers: []string{"E"}, Alters: "Protocol.DeadlineFromAnswer",
		Description: "a dispatch claim's local deadline counts from the claim's answer, not from when it was sent: an answer that came late leaves the dispatcher believing it holds a claim the database has expired, and it sends (blind bug hunt round 6, #14)",
		apply:       func(p *protocol.Protocol) { p.DeadlineFromAnswer = true }},
	{Name: "resend_deadline_from_answer", Rule: 4, Catchers: []string{"E"}, Alters: "Protocol.ResendDeadlineFromAnswer",
		Description: "a same-key resend claim's local deadline counts from the claim's answer, not from when it was sent: a reconciler whose resend claim was answered late sends under a claim the database has expired (blind bug hunt round 19, #12)",
		apply:       func(p *protocol.Protocol) { p.ResendDeadlineFromAnswer = true }},
	{Name: "consumer_past_before_apply", Rule: 10, Catchers: []string{"L"}, Alters: "Protocol.ConsumerPastBeforeApply",
		Description: "the consumer moves its read position past each message before applying it (this worker until 2026-12-02): an apply that fails (its database lost mid-batch) loses that message for good, though the process lives on",
		apply:       func(p *protocol.Protocol) { p.ConsumerPastBeforeApply = true }},
	{Name: "expired_claim_back_to_prepared", Rule: 4, Catchers: []string{"J", "E"}, Alters: "Statements.ExpireClaim",
		Description: "the reconciler turns an expired dispatch claim back into prepared instead of unknown, so it is dispatched again",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.ExpireClaim, "SET status = 'unknown'", "SET status = 'prepared'")
		}},
	{Name: "operation_id_per_process", Rule: 5, Catchers: []string{"E", "J"}, Alters: "Protocol.OperationID",
		Description: "the operation_id carries a per-process nonce: a takeover derives a new identity for the same intent",
		apply: func(p *protocol.Protocol) {
			nonce := protocol.NewUUID()[:8]
			p.OperationID = func(t, r, s string, v int) string { return protocol.OperationID(t, r, s, v) + "/" + nonce }
		}},
	{Name: "unknown_resent_as_failure", Rule: 5, Catchers: []string{"J", "E"}, Alters: "Protocol.ReconcileWithout",
		Description: "an unknown outcome of a tool that offers neither query nor idempotency is taken for a failure and the intent is sent again",
		apply: func(p *protocol.Protocol) {
			p.ReconcileWithout = func(ctx context.Context, q protocol.Querier, _ *protocol.Reconciler, u protocol.UnknownOp) (*protocol.Change, error) {
				tag, err := q.Exec(ctx, `UPDATE tool_operations SET status = 'prepared', revision = revision + 1,
  updated_at = clock_timestamp() WHERE operation_id = $1 AND status = 'unknown' AND revision = $2`, u.OperationID, u.Revision)
				if err != nil || tag.RowsAffected() != 1 {
					return nil, err
				}
				return &protocol.Change{OperationID: u.OperationID, From: "unknown", To: "prepared"}, nil
			}
		}},
	{Name: "cancel_marks_inflight_cancelled", Rule: 6, Catchers: []string{"F"}, Alters: "Statements.CancelPrepared",
		Description: "cancel marks dispatching and unknown operations cancelled too, as if they had not happened",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.CancelPrepared, "status = 'prepared'", "status IN ('prepared', 'dispatching', 'unknown')")
		}},
	{Name: "heartbeat_does_not_cancel", Rule: 8, Catchers: []string{"P"}, Alters: "Protocol.OnRenewUnconfirmed",
		Description: "an unconfirmed renewal is logged, but the execution's context is not cancelled",
		apply:       func(p *protocol.Protocol) { p.OnRenewUnconfirmed = func(context.CancelCauseFunc, error) {} }},
	{Name: "renewal_without_client_timeout", Rule: 8, Catchers: []string{"S"}, Alters: "Protocol.RenewBound",
		Description: "the heartbeat waits up to an hour for each renewal's answer instead of FENCECHECK_HEARTBEAT_TIMEOUT_MS: a black-holed link or a renewal waiting for a synchronous standby never cancels the execution in time, and a late answer keeps the lease alive",
		apply: func(p *protocol.Protocol) {
			p.RenewBound = func(time.Duration) time.Duration { return time.Hour }
		}},
	{Name: "commit_unknown_as_rollback", Rule: 9, Catchers: []string{"O"}, Alters: "Protocol.ResolveUnknown",
		Description: "a COMMIT that failed without an answer is taken for a rollback and sent again under a new event_id, without read-back",
		apply: func(p *protocol.Protocol) {
			p.ResolveUnknown = func(_ context.Context, _ *protocol.Writer, wr *protocol.Write) (*protocol.Written, error) {
				wr.EventID = protocol.NewUUID()
				return nil, nil
			}
		}},
	{Name: "no_answer_taken_as_refusal", Rule: 5, Catchers: []string{"S"}, Alters: "Protocol.WithoutResult",
		Description: "a tool call without an answer (timeout, reset after sending, late answer) is taken for the tool's refusal: the claim goes back to prepared and the request is sent again, although the tool may have acted",
		apply: func(p *protocol.Protocol) {
			p.WithoutResult = func(tool.Answer) string { return "prepared" }
		}},
	{Name: "consumer_without_dedup", Rule: 10, Catchers: []string{"L"}, Alters: "Statements.ConsumeDedup",
		Description: "the consumer applies its business effect for every delivery, without its dedup row",
		apply:       func(p *protocol.Protocol) { p.SQL.ConsumeDedup = "" }},
	{Name: "local_commit_taken_for_sync", Rule: 11, Catchers: []string{"H"}, Alters: "Protocol.DurabilityMode",
		Description: "any synchronous_commit level but off is taken for a synchronous one: with standby names set and synchronous_commit = local the worker declares sync (blind bug hunt round 4, #08)",
		apply: func(p *protocol.Protocol) {
			p.DurabilityMode = func(level, names string, standbys int) string {
				switch {
				case names != "" && level != "off":
					return "sync"
				case names != "" || standbys > 0:
					return "async"
				}
				return "none"
			}
		}},
	{Name: "assumes_sync_replication", Rule: 11, Catchers: []string{"H"}, Alters: "Protocol.DurabilityMode",
		Description: "the worker declares the synchronous guarantee without reading the settings",
		apply:       func(p *protocol.Protocol) { p.DurabilityMode = func(string, string, int) string { return "sync" } }},
	{Name: "sync_warning_as_success", Rule: 11, Catchers: []string{"H"}, Alters: "Protocol.CommitWarning",
		Description: "a COMMIT answered with a WARNING (cancelled wait for the synchronous standby) is reported as durable",
		apply:       func(p *protocol.Protocol) { p.CommitWarning = func([]*pgconn.Notice) error { return nil } }},
	{Name: "rls_missing", Rule: 12, Catchers: []string{"N"}, Alters: "database overlay",
		Description: "row level security is off: nothing scopes a query to the caller's tenant",
		overlay: `DO $$ DECLARE t text; BEGIN
  FOREACH t IN ARRAY ARRAY['tenants', 'agent_tasks', 'agent_runs', 'agent_checkpoints',
                           'tool_operations', 'outbox', 'consumed_events', 'consumer_effects'] LOOP
    EXECUTE format('ALTER TABLE public.%I DISABLE ROW LEVEL SECURITY', t);
  END LOOP; END $$`},
	{Name: "guard_without_commit_check", Rule: 12, Catchers: []string{"N"}, Alters: "database overlay",
		Description: "the protocol guard's checks at COMMIT are missing: a revision + 1 is accepted without its checkpoint and event, or with a checkpoint of another owner, and an intent outside a protected write",
		overlay: `DROP TRIGGER agent_runs_write_check ON public.agent_runs;
DROP TRIGGER tool_operations_intent_check ON public.tool_operations`},
	{Name: "requeue_without_backoff", Rule: 4, Catchers: []string{"U"}, Alters: "Protocol.Backoff",
		Description: "a run requeued after a transient refusal (429) is due again at once: the backoff is ignored and the tool is asked again immediately",
		apply:       func(p *protocol.Protocol) { p.Backoff = func(string, int) int64 { return 0 } }},
	{Name: "budget_never_spent", Rule: 4, Catchers: []string{"U"}, Alters: "Protocol.BudgetSpent",
		Description: "the attempt budget is compared with > instead of >=: the run gets one attempt more than max_attempts before it pauses for a human",
		apply:       func(p *protocol.Protocol) { p.BudgetSpent = func(a, m int32) bool { return a > m } }},
	{Name: "resolve_unaudited", Rule: 4, Catchers: []string{"J"}, Alters: "Protocol.Audit",
		Description: "an operator decision writes no operator_actions row (who, why, ticket, before/after): the resolution of an operation in doubt leaves no audit",
		apply: func(p *protocol.Protocol) {
			p.Audit = func(context.Context, protocol.Querier, *protocol.Protocol, protocol.AuditRow) (int64, error) {
				return 0, nil
			}
		}},
	{Name: "supplement_dropped", Rule: 5, Catchers: []string{"V"}, Alters: "Protocol.Request",
		Description: "the tool request is built from the checkpoint alone: an operator's supplement queues the run again but never reaches the tool",
		apply: func(p *protocol.Protocol) {
			correct := p.Request
			p.Request = func(state, input map[string]any) map[string]any {
				rest := map[string]any{}
				for k, v := range input {
					if k != "supplement" {
						rest[k] = v
					}
				}
				return correct(state, rest)
			}
		}},
	{Name: "claim_queued_first", Rule: 1, Catchers: []string{"Z"}, Alters: "Statements.Claim",
		Description: "a claim of any run orders due queued runs before expired leases (a sort direction flipped): work whose holder died waits behind new work (blind bug hunt round 4, #11)",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.Claim, "ORDER BY status = 'queued', ", "ORDER BY status = 'queued' DESC, ")
		}},
	{Name: "old_checkpoint_hash_unchecked", Rule: 13, Catchers: []string{"M"}, Alters: "Protocol.Decode",
		Description: "the state hash is checked for the current schema version only (\"older workers wrote no meaningful hash\"): an older checkpoint whose state was changed after it was hashed is migrated and resumed (blind bug hunt round 3, #14)",
		apply: func(p *protocol.Protocol) {
			p.Decode = func(rev int64, version *int32, raw []byte, hash []byte) (protocol.Checkpoint, error) {
				if version != nil && *version != protocol.CurrentSchemaVersion {
					hash = nil
				}
				return protocol.DecodeCheckpoint(rev, version, raw, hash)
			}
		}},
	{Name: "unknown_schema_to_defaults", Rule: 13, Catchers: []string{"M"}, Alters: "Protocol.Decode",
		Description: "a checkpoint of an unknown schema_version is read as the current one, missing fields as zero values",
		apply: func(p *protocol.Protocol) {
			p.Decode = func(rev int64, _ *int32, raw []byte, _ []byte) (protocol.Checkpoint, error) {
				v, _ := protocol.Decode(raw)
				state, _ := v.(map[string]any)
				if state == nil {
					state = map[string]any{}
				}
				for k, zero := range map[string]any{"plan": []any{}, "cursor": 0, "data": map[string]any{}, "results": map[string]any{}} {
					if _, ok := state[k]; !ok {
						state[k] = zero
					}
				}
				return protocol.Checkpoint{Revision: rev, SchemaVersion: protocol.CurrentSchemaVersion, State: state}, nil
			}
		}},
}

// SeedVariants put one of the seeds' skeletons back as literally written,
// where this worker corrected it; docs/seed-code-findings.md says which
// experiment then fails and why. Selected with FENCECHECK_MUTANT like a
// mutant, but not listed by `mutants`: they are findings, not harness tests.
var SeedVariants = []Mutant{
	{Name: "seed_en_release", Rule: 1, Catchers: []string{"H"}, Alters: "Statements.Release",
		Description: "English seed 5.2 release as written: owner = NULL, expires_at = clock_timestamp(); status untouched",
		apply: func(p *protocol.Protocol) {
			p.SQL.Release = `UPDATE agent_runs
   SET owner = NULL, lease_expires_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE run_id = $1 AND owner = $2 AND epoch = $3`
		}},
	{Name: "seed_en_cas_running_only", Rule: 2, Catchers: []string{"I", "E", "Q"}, Alters: "Statements.CAS",
		Description: "English seed 6 CAS condition as written: `AND status = 'running'` (no waiting_tool)",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.CAS, "WHERE run_id = $1 AND revision = $2", "WHERE run_id = $1 AND revision = $2 AND status = 'running'")
		}},
	{Name: "seed_en_dispatch_live_statuses", Rule: 4, Catchers: []string{"I", "E", "Q"}, Alters: "Statements.DispatchClaim",
		Description: "English seed 9.2 dispatcher claim as written: runs in ('pending','running') only (here queued, running)",
		apply: func(p *protocol.Protocol) {
			replace(&p.SQL.DispatchClaim, "r.status IN ('queued', 'running', 'waiting_tool')", "r.status IN ('queued', 'running')")
		}},
	{Name: "seed_en_commit_error_returned", Rule: 9, Catchers: []string{"O"}, Alters: "Protocol.ResolveUnknown",
		Description: "English seed 6: a COMMIT error is returned as `commit outcome requires read-back`, and nothing reads back",
		apply: func(p *protocol.Protocol) {
			p.ResolveUnknown = func(_ context.Context, _ *protocol.Writer, wr *protocol.Write) (*protocol.Written, error) {
				return nil, &protocol.Error{Class: "CommitOutcomeUnknown", Reason: "no_readback", Msg: "commit outcome requires read-back"}
			}
		}},
	{Name: "seed_no_fence_guard", Rule: 12, Catchers: []string{"N"}, Alters: "database overlay",
		Description: "the seeds' plain-SQL protocol without the database's protocol guard: the worker role's INSERT and UPDATE rights are unrestricted",
		overlay: `DROP TRIGGER agent_runs_guard ON public.agent_runs;
DROP TRIGGER agent_runs_write_check ON public.agent_runs;
DROP TRIGGER agent_checkpoints_guard ON public.agent_checkpoints;
DROP TRIGGER outbox_guard ON public.outbox;
DROP TRIGGER tool_operations_guard ON public.tool_operations;
DROP TRIGGER tool_operations_intent_check ON public.tool_operations`},
}

// Names of the registry, sorted.
func Names() []string {
	var out []string
	for _, m := range append(append([]Mutant{}, Registry...), SeedVariants...) {
		out = append(out, m.Name)
	}
	sort.Strings(out)
	return out
}

// Load returns the protocol for name ("" = correct) and its database overlays.
func Load(name string) (*protocol.Protocol, []schema.Overlay, error) {
	p := protocol.Correct()
	if name == "" {
		return p, nil, nil
	}
	for _, m := range append(append([]Mutant{}, Registry...), SeedVariants...) {
		if m.Name != name {
			continue
		}
		p.Name = name
		var overlays []schema.Overlay
		if m.apply != nil {
			m.apply(p)
		}
		if m.overlay != "" {
			overlays = append(overlays, schema.Overlay{Name: name, SQL: m.overlay})
		}
		if m.unmask != "" {
			overlays = append(overlays, schema.Overlay{Name: name + " (guard absent)", SQL: m.unmask})
		}
		return p, overlays, nil
	}
	return nil, nil, fmt.Errorf("FENCECHECK_MUTANT=%q names no mutant of this worker; known: %s", name, strings.Join(Names(), ", "))
}
