// A worker in another language, for the control-protocol tests: it visits
// the injection points named on its command line with the client that
// docs/control-protocol.md shows, so the doc's example is tested code.
package main

import (
	"bufio"
	"encoding/json"
	"log"
	"net"
	"os"
	"syscall"
	"time"
)

func Point(name, runID string, epoch, revision int64) {
	path := os.Getenv("FENCECHECK_CONTROL") // cache this in real code
	if path == "" {
		return
	}
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		log.Printf("point %s: control %s unreachable: %v; continuing", name, path, err)
		return
	}
	defer c.Close()
	req, _ := json.Marshal(map[string]any{"v": 1, "type": "point", "point": name,
		"worker": os.Getenv("FENCECHECK_WORKER_ID"), "pid": os.Getpid(),
		"run_id": runID, "epoch": epoch, "revision": revision, "operation_id": nil})
	c.Write(append(req, '\n'))
	line, err := bufio.NewReader(c).ReadBytes('\n') // no deadline: a hold may last
	var ans struct {
		Action string
		Ms     int
	}
	if err != nil || json.Unmarshal(line, &ans) != nil {
		log.Printf("point %s: no answer; continuing", name)
		return
	}
	switch ans.Action {
	case "delay":
		time.Sleep(time.Duration(ans.Ms) * time.Millisecond)
	case "crash":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

func main() {
	for _, p := range os.Args[1:] {
		Point(p, "run-go", 1, 2)
		os.Stdout.WriteString("passed " + p + "\n")
	}
}
