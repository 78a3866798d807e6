// Package worker is the worker's three faces under the contract: run (the
// autonomous loop over the built-in workflow), ops (protocol operations as
// JSON lines) and the wiring they share.
package worker

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Settings are the contract's environment variables (worker contract section 2).
type Settings struct {
	DSN, AdminDSN, WorkerID, Tenant, ToolURL, BrokerURL, Mutant string
	LeaseTTLMS, HeartbeatMS, HeartbeatTimeoutMS, DispatchTTLMS  int64
	ToolTimeout                                                 time.Duration
	Session                                                     string // one worker session, fixed for the process
}

// DefaultTenant is used when FENCECHECK_TENANT is unset.
const DefaultTenant = "00000000-0000-0000-0000-000000000001"

func envInt(name string, def int64) (int64, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s must be a positive integer (milliseconds), got %q", name, v)
	}
	return n, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// FromEnv reads the settings; a bad value is an error that says which.
func FromEnv() (Settings, error) {
	s := Settings{
		DSN: os.Getenv("FENCECHECK_DSN"), AdminDSN: os.Getenv("FENCECHECK_ADMIN_DSN"),
		WorkerID: envOr("FENCECHECK_WORKER_ID", "worker"), Tenant: envOr("FENCECHECK_TENANT", DefaultTenant),
		ToolURL: os.Getenv("FENCECHECK_TOOL_URL"), BrokerURL: os.Getenv("FENCECHECK_BROKER_URL"),
		Mutant: os.Getenv("FENCECHECK_MUTANT"),
	}
	var err error
	for _, f := range []struct {
		name string
		dst  *int64
		def  int64
	}{
		{"FENCECHECK_LEASE_TTL_MS", &s.LeaseTTLMS, 10000},
		{"FENCECHECK_HEARTBEAT_MS", &s.HeartbeatMS, 2000},
		{"FENCECHECK_HEARTBEAT_TIMEOUT_MS", &s.HeartbeatTimeoutMS, 1000},
		{"FENCECHECK_DISPATCH_TTL_MS", &s.DispatchTTLMS, 10000},
	} {
		if *f.dst, err = envInt(f.name, f.def); err != nil {
			return s, err
		}
	}
	toolMS, err := envInt("FENCECHECK_TOOL_TIMEOUT_MS", 3000)
	if err != nil {
		return s, err
	}
	s.ToolTimeout = time.Duration(toolMS) * time.Millisecond
	if s.HeartbeatMS >= s.LeaseTTLMS {
		return s, fmt.Errorf("FENCECHECK_HEARTBEAT_MS (%d) must be shorter than FENCECHECK_LEASE_TTL_MS (%d)", s.HeartbeatMS, s.LeaseTTLMS)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	s.Session = hex.EncodeToString(b[:])
	return s, nil
}

// Owner is this worker session's lease owner: "<worker id>/<session>".
func (s Settings) Owner() string { return s.WorkerID + "/" + s.Session }
