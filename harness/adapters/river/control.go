package main

// The worker side of fencecheck's control protocol and event history
// (docs/control-protocol.md, docs/worker-contract.md sections 3 and 4), as the
// contract's Go client writes it: outside the harness both do nothing.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

var (
	controlPath = os.Getenv("FENCECHECK_CONTROL")
	workerID    = os.Getenv("FENCECHECK_WORKER_ID")
	historyMu   sync.Mutex
	historyFD   = -1
	historyOpen sync.Once
)

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// point announces an injection point and obeys the answer (a hold is the
// harness not answering yet: the read has no deadline).
func point(name, runID string) {
	if controlPath == "" {
		return
	}
	c, err := net.DialTimeout("unix", controlPath, 5*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "injection point %s: control socket %s unreachable: %v; continuing\n", name, controlPath, err)
		return
	}
	defer c.Close()
	req, _ := json.Marshal(map[string]any{"v": 1, "type": "point", "point": name, "worker": workerID,
		"pid": os.Getpid(), "run_id": nullable(runID), "epoch": nil, "revision": nil, "operation_id": nil})
	if _, err := c.Write(append(req, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "injection point %s: cannot send: %v; continuing\n", name, err)
		return
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	var ans struct {
		Action string   `json:"action"`
		Ms     *float64 `json:"ms"`
	}
	if err != nil || json.Unmarshal(line, &ans) != nil {
		fmt.Fprintf(os.Stderr, "injection point %s: closed without an answer; continuing\n", name)
		return
	}
	switch ans.Action {
	case "continue":
	case "delay":
		if ans.Ms != nil {
			time.Sleep(time.Duration(*ans.Ms * float64(time.Millisecond)))
		}
	case "crash":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	default:
		fmt.Fprintf(os.Stderr, "injection point %s: unknown action %q; continuing\n", name, ans.Action)
	}
}

// record appends one history line (one write(2) with O_APPEND).
func record(kind, op, runID string, epoch *int64, errText string) {
	historyOpen.Do(func() {
		if path := os.Getenv("FENCECHECK_EVENTS"); path != "" {
			fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
			if err == nil {
				historyFD = fd
			}
		}
	})
	if historyFD < 0 {
		return
	}
	line, err := json.Marshal(map[string]any{
		"time": float64(time.Now().UnixMicro()) / 1e6, "worker": workerID, "pid": os.Getpid(),
		"type": kind, "op": op, "run_id": nullable(runID), "epoch": epoch, "revision": nil,
		"operation_id": nil, "event_id": nil, "error": nullable(errText), "detail": map[string]any{},
	})
	if err != nil {
		return
	}
	historyMu.Lock()
	defer historyMu.Unlock()
	_, _ = syscall.Write(historyFD, append(line, '\n'))
}
