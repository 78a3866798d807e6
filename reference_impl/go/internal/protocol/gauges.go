package protocol

import (
	"context"

	"fencecheck/goworker/internal/metrics"
)

// gaugesSQL reads the database gauges of docs/operations.md in one short
// statement; row level security scopes it to the session's tenant.
const gaugesSQL = `SELECT 'agent_runs_by_status', status, count(*)::float8 FROM agent_runs GROUP BY status
UNION ALL
SELECT 'agent_oldest_queued_age_seconds', '',
       COALESCE(extract(epoch FROM clock_timestamp() - min(updated_at)), 0)::float8
  FROM agent_runs WHERE status = 'queued'
UNION ALL
SELECT 'in_doubt_age_seconds', '', COALESCE(extract(epoch FROM clock_timestamp() - min(updated_at)), 0)::float8
  FROM agent_runs WHERE status = 'paused_indoubt'
UNION ALL
SELECT 'tool_operation_unknown_oldest_age_seconds', '',
       COALESCE(extract(epoch FROM clock_timestamp() - min(updated_at)), 0)::float8
  FROM tool_operations WHERE status = 'unknown'
UNION ALL
SELECT 'outbox_oldest_pending_age_seconds', '',
       COALESCE(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
  FROM outbox WHERE published_at IS NULL`

// DatabaseGauges reads the tenant's gauges for one scrape.
func DatabaseGauges(ctx context.Context, q Querier) ([]metrics.Sample, error) {
	rows, err := q.Query(ctx, gaugesSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []metrics.Sample
	for rows.Next() {
		var s metrics.Sample
		var label string
		if err := rows.Scan(&s.Name, &label, &s.Value); err != nil {
			return nil, err
		}
		s.Help = "read from the database at scrape time"
		if label != "" {
			s.Labels = map[string]string{"status": label}
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
