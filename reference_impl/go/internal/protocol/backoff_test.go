package protocol

import "testing"

// The same values as reference_impl/backoff.py (python -c 'from
// reference_impl.backoff import delay_ms; ...'): both workers store the
// same next_attempt_at for the same run and attempt.
func TestBackoffMatchesThePythonWorker(t *testing.T) {
	for _, c := range []struct {
		run     string
		attempt int
		want    int64
	}{
		{"00000000-0000-0000-0000-000000000001", 1, 132},
		{"00000000-0000-0000-0000-000000000001", 2, 244},
		{"00000000-0000-0000-0000-000000000001", 20, 45753},
	} {
		if got := BackoffMS(c.run, c.attempt); got != c.want {
			t.Errorf("BackoffMS(%s, %d) = %d, want %d", c.run, c.attempt, got, c.want)
		}
	}
}

func TestBackoffGrowsAndStaysInItsBand(t *testing.T) {
	prev := int64(0)
	for attempt := 1; attempt <= 6; attempt++ {
		full := int64(BackoffBaseMS) << (attempt - 1)
		got := BackoffMS("r", attempt)
		if got < full/2 || got >= full || got <= prev {
			t.Errorf("attempt %d: %d outside [%d, %d) or not above %d", attempt, got, full/2, full, prev)
		}
		prev = got
	}
}
