package injection

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// Event is one line of the history: the worker's own account, in the shape
// of a Jepsen history (invoke / ok / fail / info).
type Event struct {
	Type        string
	Op          string
	RunID       string
	Epoch       *int64
	Revision    *int64
	OperationID string
	EventID     string
	Error       string
	Detail      map[string]any
}

var (
	historyOnce sync.Once
	historyFD   = -1
)

func historyFile() int {
	historyOnce.Do(func() {
		path := os.Getenv("FENCECHECK_EVENTS")
		if path == "" {
			return
		}
		fd, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_APPEND|syscall.O_CREAT|syscall.O_CLOEXEC, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "event history %s cannot be opened: %v\n", path, err)
			return
		}
		historyFD = fd
	})
	return historyFD
}

// Record appends one event: one write(2) per line with O_APPEND, no user
// space buffer, so a SIGKILL can tear at most the very last line.
func Record(e Event) {
	fd := historyFile()
	if fd < 0 {
		return
	}
	detail := e.Detail
	if detail == nil {
		detail = map[string]any{}
	}
	var errv any
	if e.Error != "" {
		errv = e.Error
	}
	line, err := json.Marshal(map[string]any{
		"time": float64(time.Now().UnixMicro()) / 1e6, "worker": workerID, "pid": os.Getpid(),
		"type": e.Type, "op": e.Op, "run_id": nullable(e.RunID), "epoch": e.Epoch, "revision": e.Revision,
		"operation_id": nullable(e.OperationID), "event_id": nullable(e.EventID), "error": errv, "detail": detail,
	})
	if err != nil {
		return
	}
	_, _ = syscall.Write(fd, append(line, '\n'))
}
