package protocol_test

import (
	"os"
	"testing"

	"fencecheck/goworker/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop()
	os.Exit(code)
}
