// Package injection is the worker side of the harness's control protocol
// (docs/control-protocol.md) and the event history (worker contract section
// 4). Outside the harness (FENCECHECK_CONTROL / FENCECHECK_EVENTS unset)
// both cost a read of a cached variable and do nothing.
package injection

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

var (
	controlPath = os.Getenv("FENCECHECK_CONTROL")
	workerID    = os.Getenv("FENCECHECK_WORKER_ID")
)

// Active reports whether a harness control socket is configured.
func Active() bool { return controlPath != "" }

// Point is one named injection point: one connection, one JSON line each
// way. The read has no deadline: the harness holds a barrier by not
// answering. A socket that cannot be reached or a reply that makes no sense
// is warned about on stderr and the worker goes on; it never stops the
// worker by itself.
func Point(name, runID string, epoch, revision *int64, operationID string) {
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
		"pid": os.Getpid(), "run_id": nullable(runID), "epoch": epoch, "revision": revision,
		"operation_id": nullable(operationID)})
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
		if ans.Ms == nil {
			fmt.Fprintf(os.Stderr, "injection point %s: delay without ms; continuing\n", name)
			return
		}
		time.Sleep(time.Duration(*ans.Ms * float64(time.Millisecond)))
	case "crash":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never reached: SIGKILL cannot be caught
	default:
		fmt.Fprintf(os.Stderr, "injection point %s: unknown action %q; continuing\n", name, ans.Action)
	}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
