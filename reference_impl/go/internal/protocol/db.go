package protocol

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the seeds' functions take: *pgx.Conn and *pgxpool.Pool both
// satisfy it.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Querier runs statements inside or outside a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReadCommitted is the isolation level of every protocol transaction.
var ReadCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// Session is one connection of the worker's login role, (re)connected on
// demand.
//
// Invariants: the tenant is the login role's binding (worker contract
// section 7), never a setting of the session; the worker name
// (application_name) travels in the startup packet; WARNING notices are
// kept until drained, so a
// COMMIT answered with a warning (a cancelled wait for synchronous
// replication) is never mistaken for a clean success; a connection that
// failed without a server verdict is dropped, never reused.
type Session struct {
	cfg      *pgx.ConnConfig
	mu       sync.Mutex
	conn     *pgx.Conn
	warnings []*pgconn.Notice
}

// NewSession parses dsn; appName names the worker in every connection.
func NewSession(dsn, appName string) (*Session, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg}
	if appName != "" {
		cfg.RuntimeParams["application_name"] = appName
	}
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		// The unlocalized severity: a server with non-English lc_messages
		// names it otherwise, and a cancelled sync wait's warning would be missed.
		if n.SeverityUnlocalized == "WARNING" || (n.SeverityUnlocalized == "" && n.Severity == "WARNING") {
			s.mu.Lock()
			s.warnings = append(s.warnings, n)
			s.mu.Unlock()
		}
	}
	return s, nil
}

// Conn is the open connection, connecting first when there is none.
func (s *Session) Conn(ctx context.Context) (*pgx.Conn, error) {
	s.mu.Lock()
	c := s.conn
	s.mu.Unlock()
	if c != nil && !c.IsClosed() {
		return c, nil
	}
	c, err := pgx.ConnectConfig(ctx, s.cfg.Copy())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	return c, nil
}

// BoundTenant is the tenant the database binds this session's login role
// to (fencecheck.session_tenant()), or "" when the role has no binding.
func (s *Session) BoundTenant(ctx context.Context) (string, error) {
	c, err := s.Conn(ctx)
	if err != nil {
		return "", err
	}
	var t *string
	if err := c.QueryRow(ctx, `SELECT fencecheck.session_tenant()::text`).Scan(&t); err != nil {
		return "", s.Check(err)
	}
	if t == nil {
		return "", nil
	}
	return *t, nil
}

// Check drops the connection when err carries no server verdict; returns err.
func (s *Session) Check(err error) error {
	if err != nil && IsConnectionError(err) {
		s.Discard()
	}
	return err
}

// Discard closes the connection without waiting on the network.
func (s *Session) Discard() {
	s.mu.Lock()
	c := s.conn
	s.conn = nil
	s.mu.Unlock()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 0)
		defer cancel()
		_ = c.Close(ctx)
	}
}

// Close ends the session.
func (s *Session) Close() { s.Discard() }

// DrainWarnings returns and forgets the WARNING notices received so far.
func (s *Session) DrainWarnings() []*pgconn.Notice {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.warnings
	s.warnings = nil
	return w
}

// updateOne runs an UPDATE ... RETURNING that must change exactly one row
// and scans that row into dest. Invariant (Chinese seed section 8.2): every
// UPDATE's RowsAffected() is checked; zero rows is reported as false, never
// ignored, and the values come from RETURNING, not from the caller's inputs.
func updateOne(ctx context.Context, q Querier, sql string, args []any, dest ...any) (bool, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return false, err
	}
	found := false
	for rows.Next() {
		if found {
			rows.Close()
			return false, newErr("LedgerConflict", "rows", "statement changed more than one row")
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return false, err
		}
		found = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	return found && rows.CommandTag().RowsAffected() == 1, nil
}

// execOne runs an UPDATE without RETURNING; true when exactly one row changed.
func execOne(ctx context.Context, q Querier, sql string, args ...any) (bool, error) {
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}
