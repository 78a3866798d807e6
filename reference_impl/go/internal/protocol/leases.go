package protocol

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease is the proof of ownership every protected write presents.
type Lease struct {
	RunID string
	Owner string
	Epoch int64
}

// Claim is the answer of ClaimRun / Takeover (the Chinese seed's Claim,
// with the lease's owner and expiry).
type Claim struct {
	RunID     string
	Status    string
	Revision  int64
	Epoch     int64
	StepKey   *string
	Owner     string
	ExpiresAt time.Time
}

// Lease of a granted claim.
func (c *Claim) Lease() Lease { return Lease{c.RunID, c.Owner, c.Epoch} }

func scanClaim(row pgx.Row) (*Claim, error) {
	c := new(Claim)
	err := row.Scan(&c.RunID, &c.Status, &c.Revision, &c.Epoch, &c.StepKey, &c.Owner, &c.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ClaimRun claims any runnable run of the tenant (Chinese seed section 5):
// nil, nil when nothing is claimable now, which is never a task failure.
func (p *Protocol) ClaimRun(ctx context.Context, db DB, workerID string, leaseMS int64) (*Claim, error) {
	return scanClaim(db.QueryRow(ctx, p.SQL.Claim, workerID, leaseMS))
}

// Takeover acquires one run's lease, waiting for its row lock (English seed
// section 5.1): the row lock first, whatever the run's status, so a
// takeover waits for any transaction holding it (a protected write, an
// operator's decision) and then judges the run as that transaction left it
// (the acquire runs as a statement of its own, with a new snapshot). Not
// granted: nil and the reason (missing, terminal, paused, held, not_due).
func (p *Protocol) Takeover(ctx context.Context, db DB, runID, owner string, leaseMS int64) (*Claim, string, error) {
	var c *Claim
	err := pgx.BeginTxFunc(ctx, db, ReadCommitted, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, p.SQL.LockLease, runID).Scan(&id); err != nil {
			return err
		}
		var err error
		c, err = scanClaim(tx.QueryRow(ctx, p.SQL.Takeover, runID, owner, leaseMS))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, "missing", nil
	}
	if err != nil || c != nil {
		return c, "acquired", FromDatabase(err)
	}
	why, err := p.leaseMiss(ctx, db, runID)
	return nil, why, err
}

// leaseMiss explains a lease statement that matched no row (read without a
// lock: advisory, for the caller's report only).
func (p *Protocol) leaseMiss(ctx context.Context, db DB, runID string) (string, error) {
	var status string
	var owner *string
	var epoch int64
	var live, notDue bool
	err := db.QueryRow(ctx, p.SQL.LeaseMiss, runID).Scan(&status, &owner, &epoch, &live, &notDue)
	if errors.Is(err, pgx.ErrNoRows) {
		return "missing", nil
	}
	if err != nil {
		return "", err
	}
	switch {
	case status == "succeeded" || status == "failed" || status == "cancelled":
		return "terminal", nil
	case status == "paused_indoubt" || status == "paused_human":
		return "paused", nil
	case status == "queued" && notDue:
		return "not_due", nil
	case live:
		return "held", nil
	}
	return "expired", nil
}

// Renew extends the lease (English seed section 5.2). Zero rows is
// ErrLeaseLost: a lease cannot be resurrected. A network error is returned
// as it is: the renewal may or may not have happened (unconfirmed).
func (p *Protocol) Renew(ctx context.Context, db DB, l Lease, leaseMS int64) (time.Time, error) {
	rows, err := db.Query(ctx, p.SQL.Renew, l.RunID, l.Owner, l.Epoch, leaseMS)
	if err != nil {
		return time.Time{}, renewRefused(err)
	}
	var expires time.Time
	for rows.Next() {
		if err := rows.Scan(&expires); err != nil {
			rows.Close()
			return time.Time{}, err
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return time.Time{}, renewRefused(err)
	}
	if !p.RenewConfirmed(rows.CommandTag()) {
		why, err := p.leaseMiss(ctx, db, l.RunID)
		if err != nil || why == "held" {
			why = "lost" // another holder's live lease, or the cause could not be read
		}
		return time.Time{}, newErr("LeaseLost", why, "renew refused: %s", why)
	}
	return expires, nil
}

// renewRefused names the database guard's refusal of a renewal (FC013: the
// lease ran out while the renewal waited on the run's row, its WHERE judged
// before the wait) as the contract does: LeaseLost, not a database error.
func renewRefused(err error) error {
	if SQLState(err) == "FC013" {
		return newErr("LeaseLost", "expired", "renew refused: the lease ran out while the renewal waited (%v)", err)
	}
	return err
}

// Release gives the lease back, keeping the epoch.
func (p *Protocol) Release(ctx context.Context, db DB, l Lease) error {
	ok, err := execOne(ctx, db, p.SQL.Release, l.RunID, l.Owner, l.Epoch)
	if err != nil {
		return FromDatabase(err)
	}
	if !ok {
		why, _ := p.leaseMiss(ctx, db, l.RunID)
		if why == "held" {
			why = "lost"
		}
		return newErr("LeaseLost", why, "release refused: %s", why)
	}
	return nil
}
