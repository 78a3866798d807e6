package protocol

import "context"

// The durability contract (rule 11; English seed section 10): ownership is
// judged on the primary only; the worker reads what a COMMIT acknowledgement
// is worth here and never claims the synchronous guarantee under async.
var guarantees = map[string]string{
	"sync": "synchronous replication: a COMMIT is acknowledged only after a synchronous standby confirmed it;" +
		" promoting that standby keeps every acknowledged epoch, checkpoint and ledger row. A COMMIT answered" +
		" with a warning (cancelled wait for the standby) is treated as outcome unknown, never as durable.",
	"async": "asynchronous replication: acknowledged commits (epochs, checkpoints, ledger rows) may be LOST if a" +
		" lagging standby is promoted; stale workers must then be fenced by other means. The synchronous" +
		" guarantee is NOT claimed.",
	"none": "no standby visible: commits are durable on this primary only; a restore from backup can lose" +
		" acknowledged epochs.",
}

func durabilityMode(level, standbyNames string, standbys int) string {
	switch {
	case standbyNames != "" && (level == "on" || level == "remote_write" || level == "remote_apply"):
		return "sync"
	case standbyNames != "" || standbys > 0:
		return "async"
	}
	return "none"
}

// Durability reads the settings and says which guarantee holds.
func (p *Protocol) Durability(ctx context.Context, q Querier) (map[string]any, error) {
	var level, names, version string
	var recovery bool
	if err := q.QueryRow(ctx, p.SQL.DurabilitySettings).Scan(&level, &names, &recovery, &version); err != nil {
		return nil, err
	}
	standbys := []map[string]any{}
	if rows, err := q.Query(ctx, p.SQL.ReplicationView); err == nil {
		for rows.Next() {
			var app, state, sync string
			if rows.Scan(&app, &state, &sync) == nil {
				standbys = append(standbys, map[string]any{"application_name": app, "state": state, "sync_state": sync})
			}
		}
		rows.Close()
	}
	mode := p.DurabilityMode(level, names, len(standbys))
	g := guarantees[mode]
	if level == "off" {
		g += " synchronous_commit=off: even a local COMMIT may be lost in a crash."
	}
	if recovery {
		g = "this server is a standby: ownership cannot be judged here. " + g
	}
	return map[string]any{"mode": mode, "guarantee": g, "standbys": standbys, "settings": map[string]any{
		"synchronous_commit": level, "synchronous_standby_names": names, "in_recovery": recovery, "server_version": version}}, nil
}
