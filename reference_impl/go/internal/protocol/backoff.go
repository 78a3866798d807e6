package protocol

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
)

// Retry backoff (Chinese seed section 10): exponential, capped, with
// bounded jitter, the same formula as the Python reference worker.
//
//	delay(run, attempt) = d/2 + floor(d/2 * u),  d = min(BackoffBaseMS * 2^(attempt-1), BackoffCapMS),
//	u = first 8 bytes of sha256("<run_id>:<attempt>") / 2^64
//
// Invariant: a pure function of (run_id, attempt), so any worker computes
// the same next_attempt_at and it can be judged from the database alone
// (experiment U); the jitter spreads runs that failed together and never
// exceeds half the delay.
const (
	BackoffBaseMS = 200
	BackoffCapMS  = 60_000
)

// BackoffMS is the wait before attempt attempt+1 of run runID (attempt >= 1).
func BackoffMS(runID string, attempt int) int64 {
	attempt = max(attempt, 1)
	full := int64(BackoffCapMS)
	if attempt-1 < 32 {
		full = min(int64(BackoffBaseMS)<<(attempt-1), BackoffCapMS)
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s:%d", runID, attempt)))
	u := float64(binary.BigEndian.Uint64(sum[:8])) / math.Pow(2, 64)
	return full/2 + int64(float64(full)/2*u)
}
