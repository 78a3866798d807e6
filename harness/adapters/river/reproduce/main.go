// Command reproduce shows fencecheck's findings on River v0.51.2 against a
// bare PostgreSQL, with nothing of fencecheck:
//
//	go run ./reproduce "postgres://user@host:port/db"
//
// It migrates River into a fresh schema "repro" and plays River's own
// services through its driver's executor, the statements River runs:
// a producer's fetch (JobGetAvailable), the rescuer (JobGetStuck,
// JobRescueMany) once a job has run longer than RescueStuckJobsAfter, the
// scheduler (JobSchedule), and a worker's completer (JobSetStateIfRunningMany:
// completed, or snoozed to available for JobSnooze(0)). Client A's attempt is
// stale when it acts: it was paused past the rescue horizon (a GC pause, a VM
// freeze, SIGSTOP) and client B holds the job's next attempt. Each finding
// ends REPRODUCED or NOT REPRODUCED; the exit status counts the latter.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

const horizon = time.Second // RescueStuckJobsAfter, shortened

type args struct{}

func (args) Kind() string { return "repro" }

type world struct {
	ctx    context.Context
	exec   riverdriver.Executor
	client *river.Client[pgx.Tx]
}

func must[T any](v T, err error) T {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(100)
	}
	return v
}

func (w world) fetch(client string) *rivertype.JobRow {
	got := must(w.exec.JobGetAvailable(w.ctx, &riverdriver.JobGetAvailableParams{
		ClientID: client, MaxAttemptedBy: 100, MaxToLock: 1, Queue: "q", Schema: "repro"}))
	if len(got.Jobs) == 0 {
		return nil
	}
	return got.Jobs[0]
}

// rescue is River's rescuer and scheduler: a job running since before the
// horizon becomes retryable, due now, then available.
func (w world) rescue() {
	now := time.Now()
	stuck := must(w.exec.JobGetStuck(w.ctx, &riverdriver.JobGetStuckParams{Max: 100, Schema: "repro", StuckHorizon: now.Add(-horizon)}))
	for _, job := range stuck {
		e, _ := json.Marshal(map[string]any{"at": now, "attempt": job.Attempt, "error": "Stuck job rescued by Rescuer", "trace": ""})
		must(w.exec.JobRescueMany(w.ctx, &riverdriver.JobRescueManyParams{ID: []int64{job.ID}, Error: [][]byte{e},
			FinalizedAt: []*time.Time{nil}, ScheduledAt: []time.Time{now}, Schema: "repro",
			State: []string{string(rivertype.JobStateRetryable)}, StuckHorizon: now.Add(-horizon)}))
	}
	must(w.exec.JobSchedule(w.ctx, &riverdriver.JobScheduleParams{Max: 100, Now: &now, Schema: "repro"}))
}

func (w world) set(p *riverdriver.JobSetStateIfRunningParams) *rivertype.JobRow {
	rows := must(w.exec.JobSetStateIfRunningMany(w.ctx, &riverdriver.JobSetStateIfRunningManyParams{
		ID: []int64{p.ID}, Attempt: []*int{p.Attempt}, ErrData: [][]byte{p.ErrData}, FinalizedAt: []*time.Time{p.FinalizedAt},
		MetadataDoMerge: []bool{p.MetadataDoMerge}, MetadataUpdates: [][]byte{p.MetadataUpdates},
		ScheduledAt: []*time.Time{p.ScheduledAt}, Schema: "repro", State: []rivertype.JobState{p.State}}))
	return rows[0]
}

func (w world) get(id int64) *rivertype.JobRow {
	return must(w.exec.JobGetByID(w.ctx, &riverdriver.JobGetByIDParams{ID: id, Schema: "repro"}))
}

// takenOver: A fetches, is paused past the horizon, the rescuer rescues, B fetches.
func (w world) takenOver() (a, b *rivertype.JobRow) {
	must(w.client.Insert(w.ctx, args{}, &river.InsertOpts{Queue: "q"}))
	a = w.fetch("client-A")
	time.Sleep(horizon + 300*time.Millisecond) // A paused
	w.rescue()
	b = w.fetch("client-B")
	return a, b
}

func staleCompletion(w world) bool {
	a, b := w.takenOver()
	fmt.Printf("  job %d: A fetched attempt %d, B holds attempt %d (attempted_by %v)\n", a.ID, a.Attempt, b.Attempt, b.AttemptedBy)
	after := w.set(riverdriver.JobSetStateCompleted(a.ID, time.Now(), nil))
	fmt.Printf("  A's completer (stale attempt %d): job is %s while B still works attempt %d\n", a.Attempt, after.State, b.Attempt)
	return after.State == rivertype.JobStateCompleted
}

func staleSnooze(w world) bool {
	a, b := w.takenOver()
	after := w.set(riverdriver.JobSetStateSnoozedAvailable(a.ID, time.Now(), a.Attempt-1, nil))
	c := w.fetch("client-C")
	fmt.Printf("  A's JobSnooze(0) (stale attempt %d): job %s, attempt %d -> %d; client C fetches it: %v while B works attempt %d\n",
		a.Attempt, after.State, b.Attempt, after.Attempt, c != nil && c.ID == a.ID, b.Attempt)
	return c != nil && c.ID == a.ID
}

func lateCompletion(w world) bool {
	must(w.client.Insert(w.ctx, args{}, &river.InsertOpts{Queue: "q"}))
	a := w.fetch("client-A")
	time.Sleep(horizon + 300*time.Millisecond) // past the rescue horizon, nobody rescued yet
	stuck := must(w.exec.JobGetStuck(w.ctx, &riverdriver.JobGetStuckParams{Max: 100, Schema: "repro", StuckHorizon: time.Now().Add(-horizon)}))
	after := w.set(riverdriver.JobSetStateCompleted(a.ID, time.Now(), nil))
	fmt.Printf("  job %d stuck by the rescuer's own query: %v; A completes it afterwards: %s\n", a.ID, len(stuck) == 1, after.State)
	return len(stuck) == 1 && after.State == rivertype.JobStateCompleted
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: reproduce POSTGRES_URL")
		os.Exit(64)
	}
	ctx := context.Background()
	missing := 0
	for _, f := range []struct {
		name string
		run  func(world) bool
	}{
		{"a stale attempt's completion lands on the new attempt (B)", staleCompletion},
		{"a stale attempt's snooze hands the running job to a third client (R)", staleSnooze},
		{"an attempt past the rescue horizon still completes (K)", lateCompletion},
	} {
		fmt.Println(f.name + ":")
		// A pool per finding: its prepared statements name the schema's types.
		pool := must(pgxpool.New(ctx, os.Args[1]))
		must(pool.Exec(ctx, "DROP SCHEMA IF EXISTS repro CASCADE; CREATE SCHEMA repro"))
		driver := riverpgxv5.New(pool)
		migrator := must(rivermigrate.New(driver, &rivermigrate.Config{Schema: "repro"}))
		must(migrator.Migrate(ctx, rivermigrate.DirectionUp, nil))
		client := must(river.NewClient(driver, &river.Config{Schema: "repro"}))
		ok := f.run(world{ctx, driver.GetExecutor(), client})
		pool.Close()
		if ok {
			fmt.Println("  REPRODUCED")
		} else {
			fmt.Println("  NOT REPRODUCED")
			missing++
		}
	}
	os.Exit(missing)
}
