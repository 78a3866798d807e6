// Command fencecheck-go-worker is a second system under test for fencecheck:
// the seeds' pgx/v5 skeletons (ClaimRun, Renew, SaveCheckpoint, the ledger's
// Tx1 / dispatch claim / Tx2, the outbox relay and consumer, Heartbeat),
// completed into a worker that follows docs/worker-contract.md.
//
//	fencecheck-go-worker migrate                       # FENCECHECK_ADMIN_DSN
//	fencecheck-go-worker run [--run-id ID] [--once] [--exit-when-idle] [--require-durability MODE]
//	fencecheck-go-worker ops                           # JSON lines on stdin/stdout
//	fencecheck-go-worker mutants                       # the named mutants, JSON
//	fencecheck-go-worker mapping                       # its fencecheck mapping (YAML)
//	fencecheck-go-worker seed-variants                 # the seeds' literal forms, JSON
//	fencecheck-go-worker bench OP N [--run-id ID --owner O --epoch E]   # timing (make go-bench)
//	fencecheck-go-worker bench-scripts                 # its statements as pgbench scripts, JSON
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	goworker "fencecheck/goworker"
	"fencecheck/goworker/internal/metrics"
	"fencecheck/goworker/internal/mutants"
	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/schema"
	"fencecheck/goworker/internal/worker"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: fencecheck-go-worker {migrate|run|ops|mutants|mapping|seed-variants} [--run-id ID] [--once] [--exit-when-idle]")
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func printJSON(v any) int {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return 1
	}
	return 0
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 64
	}
	mode := args[0]
	fs := flag.NewFlagSet(mode, flag.ContinueOnError)
	runID := fs.String("run-id", "", "run: only this run (targeted takeover, waits on the row lock)")
	once := fs.Bool("once", false, "run: exit after one run")
	idle := fs.Bool("exit-when-idle", false, "run: exit 0 when nothing is claimable")
	durability := fs.String("require-durability", "", "run: refuse to start (13) below none|async|sync")
	owner := fs.String("owner", "", "bench: the lease owner")
	epoch := fs.Int64("epoch", 0, "bench: the lease epoch")
	var positional []string
	rest := args[1:]
	for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		positional, rest = append(positional, rest[0]), rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return 64
	}
	switch mode {
	case "mutants":
		return printJSON(mutants.Registry)
	case "mapping":
		if _, err := os.Stdout.Write(goworker.Mapping); err != nil {
			return 1
		}
		return 0
	case "seed-variants":
		return printJSON(mutants.SeedVariants)
	case "bench-scripts":
		return printJSON(worker.BenchScripts(protocol.Correct()))
	case "migrate", "run", "ops", "bench":
	default:
		usage()
		return 64
	}
	settings, err := worker.FromEnv()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: %v\n", err)
		return 1
	}
	if *durability != "" {
		if err := worker.CheckDurability(*durability); err != nil {
			fmt.Fprintf(os.Stderr, "fencecheck-go-worker: --require-durability %v\n", err)
			return 64
		}
		settings.RequireDurability = *durability
	}
	p, overlays, err := mutants.Load(settings.Mutant)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: %v\n", err)
		return 1
	}
	if mode == "migrate" {
		return migrate(settings, overlays)
	}
	if *runID != "" && !protocol.ValidUUID(*runID) {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: --run-id must be a UUID, got %q\n", *runID)
		return 64
	}
	rt, err := worker.NewRuntime(settings, p)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: %v\n", err)
		return 1
	}
	defer rt.Close()
	if mode == "bench" {
		return bench(rt, positional, protocol.Lease{RunID: *runID, Owner: *owner, Epoch: *epoch})
	}
	if err := rt.StartMetrics(); err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: metrics on port %s: %v\n", settings.MetricsPort, err)
		return 1
	}
	defer metrics.WriteFile(settings.MetricsFile)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	err = rt.CheckBinding(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: %v\n", err)
		return 1
	}
	if mode == "ops" {
		return worker.NewOps(rt, os.Stdout).Serve(os.Stdin)
	}
	var stop atomic.Bool
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		stop.Store(true) // stop claiming; the current short transaction finishes
	}()
	return worker.Run(rt, *runID, *once, *idle, &stop)
}

func bench(rt *worker.Runtime, positional []string, lease protocol.Lease) int {
	if len(positional) != 2 {
		fmt.Fprintln(os.Stderr, "usage: fencecheck-go-worker bench {checkpoint|renew|claim} N [--run-id ID --owner O --epoch E]")
		return 64
	}
	n, err := strconv.Atoi(positional[1])
	if err != nil || n <= 0 {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: bench N must be a positive integer, got %q\n", positional[1])
		return 64
	}
	took, err := worker.Bench(rt, positional[0], n, lease)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: bench: %v\n", err)
		return 1
	}
	return printJSON(map[string]any{"op": positional[0], "n": n, "seconds": took.Seconds()})
}

func migrate(s worker.Settings, overlays []schema.Overlay) int {
	if s.AdminDSN == "" {
		fmt.Fprintln(os.Stderr, "fencecheck-go-worker: migrate needs FENCECHECK_ADMIN_DSN (a superuser DSN)")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	applied, err := schema.Migrate(ctx, s.AdminDSN, overlays)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fencecheck-go-worker: migrate failed: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "migrated: %v\n", applied)
	return 0
}
