// Command fencecheck-river is a thin driver of River v0.51.2 (riverqueue/river
// on pgx v5) for fencecheck (docs/worker-contract.md section 14).
//
//	fencecheck-river migrate   # River's own migrations (rivermigrate), the contract's group roles
//	fencecheck-river ops       # the contract's ops as JSON lines, through River's API and SQL
//	fencecheck-river mapping   # fencecheck-mapping.yaml (embedded)
//
// Every op is River's public API or the SQL River itself runs through its
// driver's executor (riverdriver, the interface River's own services call):
// create_run is Client.Insert into a queue of the run's own; claim is
// JobGetAvailable (River's producer fetch), after River's rescuer and
// scheduler statements (JobGetStuck, JobRescueMany, JobSchedule) when the run
// has been running longer than the lease duration (River's
// RescueStuckJobsAfter); complete is JobSetStateIfRunningMany with a completed
// state (River's completer), release the same with a snooze to available (a
// worker returning JobSnooze(0)), cancel is Client.JobCancel. River renews
// nothing: a running job's lease is its attempted_at plus the rescue horizon.
// The driver adds no check of its own: what the harness judges is River.
package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

//go:embed fencecheck-mapping.yaml
var mapping []byte

const rolesSQL = `
DO $$ BEGIN CREATE ROLE fencecheck_worker NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
DO $$ BEGIN CREATE ROLE fencecheck_operator NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
GRANT USAGE ON SCHEMA public TO fencecheck_worker, fencecheck_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO fencecheck_worker, fencecheck_operator;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO fencecheck_worker, fencecheck_operator;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO fencecheck_worker, fencecheck_operator;
`

// RunArgs is the job every run is: River runs no code of fencecheck's.
type RunArgs struct {
	TaskID string         `json:"task_id"`
	Input  map[string]any `json:"input"`
}

func (RunArgs) Kind() string { return "fencecheck_run" }

type opError struct{ class, msg string }

func (e *opError) Error() string { return e.msg }

func refused(class, format string, args ...any) error {
	return &opError{class, fmt.Sprintf(format, args...)}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fencecheck-river {migrate|ops|mapping}")
		os.Exit(64)
	}
	switch os.Args[1] {
	case "mapping":
		_, _ = os.Stdout.Write(mapping)
	case "migrate":
		if err := migrate(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "fencecheck-river migrate: %v\n", err)
			os.Exit(1)
		}
	case "ops":
		if err := serve(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "fencecheck-river ops: %v\n", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: fencecheck-river {migrate|ops|mapping}")
		os.Exit(64)
	}
}

func migrate(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, os.Getenv("FENCECHECK_ADMIN_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, rolesSQL)
	return err
}

// Driver is one River client: the owner River records in attempted_by, and
// the rows it fetched (a worker works the job as it fetched it).
type Driver struct {
	client   *river.Client[pgx.Tx]
	exec     riverdriver.Executor
	clientID string
	ttl      time.Duration
	mu       sync.Mutex
	fetched  map[int64]*rivertype.JobRow
}

var queueChars = regexp.MustCompile(`[^a-z0-9_-]+`)

func queueOf(task string) string {
	return "fc_" + queueChars.ReplaceAllString(strings.ToLower(task), "_")
}

func runID(args map[string]any) (int64, error) {
	raw := fmt.Sprint(args["run_id"])
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, refused("RunNotFound", "run_id %q is not a River job id", raw)
	}
	return id, nil
}

func (d *Driver) job(ctx context.Context, args map[string]any) (*rivertype.JobRow, error) {
	id, err := runID(args)
	if err != nil {
		return nil, err
	}
	row, err := d.exec.JobGetByID(ctx, &riverdriver.JobGetByIDParams{ID: id})
	if err != nil {
		return nil, refused("RunNotFound", "job %d: %v", id, err)
	}
	return row, nil
}

// own is the job as this client fetched it, else as the database has it now.
func (d *Driver) own(ctx context.Context, args map[string]any) (*rivertype.JobRow, error) {
	id, err := runID(args)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	row := d.fetched[id]
	d.mu.Unlock()
	if row != nil {
		return row, nil
	}
	return d.job(ctx, args)
}

func (d *Driver) createRun(ctx context.Context, args map[string]any) (any, error) {
	task := fmt.Sprint(args["task_id"])
	input, _ := args["input"].(map[string]any)
	res, err := d.client.Insert(ctx, RunArgs{TaskID: task, Input: input}, &river.InsertOpts{Queue: queueOf(task)})
	if err != nil {
		return nil, err
	}
	return map[string]any{"run_id": strconv.FormatInt(res.Job.ID, 10), "task_id": task}, nil
}

func (d *Driver) claim(ctx context.Context, args map[string]any) (any, error) {
	if args["run_id"] == nil {
		return nil, refused("NotClaimable", "a River fetch needs a queue: claim names its run")
	}
	row, err := d.job(ctx, args)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if row.State == rivertype.JobStateRunning {
		// River's rescuer: a job running since before the horizon is rescued
		// (retryable, due now); its scheduler makes it available again.
		horizon := now.Add(-d.ttl)
		stuck, err := d.exec.JobGetStuck(ctx, &riverdriver.JobGetStuckParams{Max: 1000, StuckHorizon: horizon})
		if err != nil {
			return nil, err
		}
		found := false
		for _, s := range stuck {
			found = found || s.ID == row.ID
		}
		if !found {
			return nil, refused("NotClaimable", "job %d is running and not stuck", row.ID)
		}
		attemptErr, _ := json.Marshal(map[string]any{"at": now, "attempt": row.Attempt,
			"error": "Stuck job rescued by Rescuer", "trace": ""})
		if _, err := d.exec.JobRescueMany(ctx, &riverdriver.JobRescueManyParams{
			ID: []int64{row.ID}, Error: [][]byte{attemptErr}, FinalizedAt: []*time.Time{nil},
			ScheduledAt: []time.Time{now}, State: []string{string(rivertype.JobStateRetryable)},
			StuckHorizon: horizon,
		}); err != nil {
			return nil, err
		}
	}
	if _, err := d.exec.JobSchedule(ctx, &riverdriver.JobScheduleParams{Max: 1000, Now: &now}); err != nil {
		return nil, err
	}
	got, err := d.exec.JobGetAvailable(ctx, &riverdriver.JobGetAvailableParams{
		ClientID: d.clientID, MaxAttemptedBy: 100, MaxToLock: 1, Queue: row.Queue,
	})
	if err != nil {
		return nil, err
	}
	if got == nil || len(got.Jobs) == 0 {
		return nil, refused("NotClaimable", "nothing available in queue %s", row.Queue)
	}
	job := got.Jobs[0]
	d.mu.Lock()
	d.fetched[job.ID] = job
	d.mu.Unlock()
	point("after_lease_acquired", strconv.FormatInt(job.ID, 10))
	// No fencing token: River's attempt is no epoch (nothing checks it).
	return map[string]any{"run_id": strconv.FormatInt(job.ID, 10), "epoch": nil,
		"revision": 0, "status": "running", "owner": d.clientID}, nil
}

func (d *Driver) setState(ctx context.Context, p *riverdriver.JobSetStateIfRunningParams) (*rivertype.JobRow, error) {
	rows, err := d.exec.JobSetStateIfRunningMany(ctx, &riverdriver.JobSetStateIfRunningManyParams{
		ID: []int64{p.ID}, Attempt: []*int{p.Attempt}, ErrData: [][]byte{p.ErrData},
		FinalizedAt: []*time.Time{p.FinalizedAt}, MetadataDoMerge: []bool{p.MetadataDoMerge},
		MetadataUpdates: [][]byte{p.MetadataUpdates}, ScheduledAt: []*time.Time{p.ScheduledAt},
		State: []rivertype.JobState{p.State},
	})
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, refused("RunNotFound", "job %d not found", p.ID)
	}
	return rows[0], nil
}

func (d *Driver) complete(ctx context.Context, args map[string]any) (any, error) {
	job, err := d.own(ctx, args)
	if err != nil {
		return nil, err
	}
	row, err := d.setState(ctx, riverdriver.JobSetStateCompleted(job.ID, time.Now(), nil))
	if err != nil {
		return nil, err
	}
	if row.State != rivertype.JobStateCompleted {
		return nil, refused("LeaseLost", "job %d is %s, not running", job.ID, row.State)
	}
	return map[string]any{"revision": nil, "status": "succeeded"}, nil
}

func (d *Driver) release(ctx context.Context, args map[string]any) (any, error) {
	job, err := d.own(ctx, args)
	if err != nil {
		return nil, err
	}
	// A worker's JobSnooze(0): available at once, the snooze not counted as an attempt.
	row, err := d.setState(ctx, riverdriver.JobSetStateSnoozedAvailable(job.ID, time.Now(), job.Attempt-1, nil))
	if err != nil {
		return nil, err
	}
	if row.State != rivertype.JobStateAvailable {
		return nil, refused("LeaseLost", "job %d is %s, not running", job.ID, row.State)
	}
	return map[string]any{}, nil
}

func (d *Driver) cancel(ctx context.Context, args map[string]any) (any, error) {
	id, err := runID(args)
	if err != nil {
		return nil, err
	}
	row, err := d.client.JobCancel(ctx, id)
	if err != nil {
		return nil, err
	}
	status := map[rivertype.JobState]string{rivertype.JobStateCancelled: "cancelled",
		rivertype.JobStateRunning: "running", rivertype.JobStateCompleted: "succeeded"}[row.State]
	return map[string]any{"run_status": status, "operations": []any{}}, nil
}

func (d *Driver) retryRun(ctx context.Context, args map[string]any) (any, error) {
	// River retries a job in place (JobRetry); a new attempt of the task as a
	// new run is a new job of its queue.
	return d.createRun(ctx, map[string]any{"task_id": args["task_id"]})
}

func (d *Driver) durability(context.Context, map[string]any) (any, error) {
	return map[string]any{"mode": "none", "guarantee": "River reads no replication setting"}, nil
}

func serve(ctx context.Context) error {
	pool, err := pgxpool.New(ctx, os.Getenv("FENCECHECK_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()
	drv := riverpgxv5.New(pool)
	client, err := river.NewClient(drv, &river.Config{}) // insert-only: it runs no job
	if err != nil {
		return err
	}
	ttl, _ := strconv.Atoi(os.Getenv("FENCECHECK_LEASE_TTL_MS"))
	d := &Driver{client: client, exec: drv.GetExecutor(), ttl: time.Duration(ttl) * time.Millisecond,
		clientID: fmt.Sprintf("%s-%d", workerID, os.Getpid()), fetched: map[int64]*rivertype.JobRow{}}
	ops := map[string]func(context.Context, map[string]any) (any, error){
		"create_run": d.createRun, "retry_run": d.retryRun, "claim": d.claim, "complete": d.complete,
		"release": d.release, "cancel": d.cancel, "durability": d.durability,
	}
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	answer := func(reply map[string]any) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(reply)
	}
	handle := func(req map[string]any) {
		op, _ := req["op"].(string)
		args, _ := req["args"].(map[string]any)
		if args == nil {
			args = map[string]any{}
		}
		run := fmt.Sprint(args["run_id"])
		if args["run_id"] == nil {
			run = ""
		}
		fn, found := ops[op]
		if !found {
			answer(map[string]any{"id": req["id"], "ok": false, "error": "Unsupported", "message": op})
			return
		}
		record("invoke", op, run, nil, "")
		result, err := fn(ctx, args)
		if err != nil {
			class := "Error"
			var oe *opError
			if errors.As(err, &oe) {
				class = oe.class
			}
			record("fail", op, run, nil, class)
			answer(map[string]any{"id": req["id"], "ok": false, "error": class, "message": err.Error()})
			return
		}
		if m, isMap := result.(map[string]any); isMap && m["run_id"] != nil {
			run = fmt.Sprint(m["run_id"])
		}
		record("ok", op, run, nil, "")
		answer(map[string]any{"id": req["id"], "ok": true, "result": result})
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	var wg sync.WaitGroup
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var req map[string]any
		if err := json.Unmarshal([]byte(line), &req); err != nil || req == nil {
			// No request object: answered, and the session goes on (section 5).
			answer(map[string]any{"id": nil, "ok": false, "error": "BadRequest", "message": "a request is a JSON object"})
			continue
		}
		if async, _ := req["async"].(bool); async {
			wg.Add(1)
			go func() { defer wg.Done(); handle(req) }()
		} else {
			handle(req)
		}
	}
	wg.Wait()
	return in.Err()
}
