// Package metrics is the worker's account in numbers (worker contract
// section 8): counters and histograms in the Prometheus text format,
// served on 127.0.0.1:$FENCECHECK_METRICS_PORT and written to
// $FENCECHECK_METRICS_FILE when the process ends by itself. Labels are
// outcomes, reasons, statuses and transitions only, never run, task or
// operation ids. Database gauges (runs by status, the oldest queued run,
// the oldest unknown operation, ...) are read at scrape time by one short
// statement of the process's own login role (Gauges). The names are those
// of docs/operations.md; no verdict rests on them.
package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

type family struct {
	help, kind string
	labels     []string
	values     map[string]float64 // counter: label values (joined by \x00) -> value
	hist       map[string]*histogram
}

type histogram struct {
	counts []float64
	sum    float64
	count  float64
}

var buckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

var (
	mu       sync.Mutex
	families = map[string]*family{}
	// Gauges, when set, reads the database gauges for one scrape.
	Gauges func(ctx context.Context) ([]Sample, error)
)

// Sample is one gauge value read at scrape time.
type Sample struct {
	Name, Help string
	Labels     map[string]string
	Value      float64
}

func define(name, help, kind string, labels ...string) string {
	families[name] = &family{help: help, kind: kind, labels: labels, values: map[string]float64{},
		hist: map[string]*histogram{}}
	return name
}

// The metrics this worker moves (docs/operations.md has what moves each).
var (
	LeaseAcquire       = define("lease_acquire_total", "claims and takeovers by answer", "counter", "outcome")
	LeaseRenew         = define("lease_renew_total", "heartbeat renewals by outcome", "counter", "outcome")
	WriteRejected      = define("protected_write_rejected_total", "protected writes the database refused", "counter", "reason")
	ToolUnknown        = define("tool_operation_unknown_total", "operations that became unknown", "counter")
	ToolUnknownResult  = define("tool_unknown_result_total", "operations that became unknown (Chinese seed's name)", "counter")
	CommitUnknown      = define("commit_outcome_unknown_total", "commits without a verdict, by resolution", "counter", "resolution")
	ClaimConflicts     = define("lease_claim_conflicts_total", "targeted claims that met another owner's lease", "counter")
	StaleFence         = define("stale_fence_rejections_total", "writes or renewals refused for a stale owner/epoch or expired lease", "counter")
	RenewalFailures    = define("lease_renewal_failures_total", "renewals not confirmed", "counter")
	CommitLatency      = define("checkpoint_commit_latency_seconds", "protected writes, whole duration", "histogram", "transition")
	Migrations         = define("checkpoint_migrations_total", "older checkpoints read, by result", "counter", "result")
	MigrationFailures  = define("checkpoint_migration_failures_total", "checkpoints refused", "counter")
	Reconcile          = define("reconcile_total", "reconciliation attempts of unknown operations", "counter", "outcome")
	OutboxPublished    = define("outbox_published_total", "outbox rows the broker acknowledged", "counter")
	OutboxRetries      = define("outbox_publish_retries_total", "publishes that failed (rows stay pending)", "counter")
	DedupConflicts     = define("consumer_dedup_conflicts_total", "events the consumer had processed already", "counter")
	RunsPaused         = define("runs_paused_total", "runs this worker paused", "counter", "status", "reason")
	OperatorActions    = define("operator_actions_total", "operator decisions through this process", "counter", "action")
	TakeoverDuration   = define("workflow_takeover_duration_seconds", "takeovers of an expired lease: expiry to grant", "histogram")
	LeaseRowLockWaited = define("lease_row_lock_wait_seconds", "waits for a run's row lock", "histogram")
)

// Inc adds 1 to a counter.
func Inc(name string, labels ...string) { Add(name, 1, labels...) }

// Add adds v to a counter.
func Add(name string, v float64, labels ...string) {
	mu.Lock()
	defer mu.Unlock()
	families[name].values[strings.Join(labels, "\x00")] += v
}

// Observe records one value of a histogram.
func Observe(name string, v float64, labels ...string) {
	mu.Lock()
	defer mu.Unlock()
	f := families[name]
	key := strings.Join(labels, "\x00")
	h := f.hist[key]
	if h == nil {
		h = &histogram{counts: make([]float64, len(buckets))}
		f.hist[key] = h
	}
	for i, b := range buckets {
		if v <= b {
			h.counts[i]++
		}
	}
	h.sum += v
	h.count++
}

func labelText(names []string, key string, extra ...string) string {
	var values []string
	if len(names) > 0 {
		values = strings.Split(key, "\x00")
	}
	var parts []string
	for i, n := range names {
		parts = append(parts, fmt.Sprintf("%s=%q", n, values[i]))
	}
	for i := 0; i+1 < len(extra); i += 2 {
		parts = append(parts, fmt.Sprintf("%s=%q", extra[i], extra[i+1]))
	}
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// Text is the exposition of every metric, plus the database gauges when
// asked for and reachable.
func Text(ctx context.Context, withGauges bool) string {
	var b strings.Builder
	mu.Lock()
	names := make([]string, 0, len(families))
	for n := range families {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := families[n]
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", n, f.help, n, f.kind)
		keys := make([]string, 0)
		if f.kind == "histogram" {
			for k := range f.hist {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				h := f.hist[k]
				for i, bound := range buckets {
					fmt.Fprintf(&b, "%s_bucket%s %g\n", n, labelText(f.labels, k, "le", fmt.Sprint(bound)), h.counts[i])
				}
				fmt.Fprintf(&b, "%s_bucket%s %g\n", n, labelText(f.labels, k, "le", "+Inf"), h.count)
				fmt.Fprintf(&b, "%s_sum%s %g\n%s_count%s %g\n", n, labelText(f.labels, k), h.sum, n, labelText(f.labels, k), h.count)
			}
			continue
		}
		for k := range f.values {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if len(keys) == 0 && len(f.labels) == 0 {
			fmt.Fprintf(&b, "%s 0\n", n)
		}
		for _, k := range keys {
			fmt.Fprintf(&b, "%s%s %g\n", n, labelText(f.labels, k), f.values[k])
		}
	}
	gauges := Gauges
	mu.Unlock()
	if withGauges && gauges != nil {
		if samples, err := gauges(ctx); err == nil {
			seen := map[string]bool{}
			for _, s := range samples {
				if !seen[s.Name] {
					fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", s.Name, s.Help, s.Name)
					seen[s.Name] = true
				}
				var extra []string
				for k, v := range s.Labels {
					extra = append(extra, k, v)
				}
				fmt.Fprintf(&b, "%s%s %g\n", s.Name, labelText(nil, "", extra...), s.Value)
			}
		}
	}
	return b.String()
}

// Serve answers GET /metrics on 127.0.0.1:port until the process ends.
func Serve(port string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 800*time.Millisecond)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(Text(ctx, true)))
	})
	go func() { _ = http.Serve(ln, mux) }()
	return nil
}

// WriteFile writes the final exposition (no database gauges: the process
// is ending) to path, atomically.
func WriteFile(path string) {
	if path == "" {
		return
	}
	text := Text(context.Background(), false)
	tmp := path + ".tmp"
	if os.WriteFile(tmp, []byte(text), 0o644) == nil {
		_ = os.Rename(tmp, path)
	}
}
