package worker

import (
	"fencecheck/goworker/internal/injection"
	"fencecheck/goworker/internal/protocol"
)

// ids of one operation for its history lines.
type ids struct {
	RunID, OperationID, EventID string
	Epoch, Revision             *int64
}

// record writes invoke now and returns the function that writes the
// outcome: ok, fail (definitely did not happen: a protocol refusal) or info
// (may or may not have happened: an unknown commit, a lost connection).
func record(op string, id ids, detail map[string]any) func(err error, after ids) {
	injection.Record(injection.Event{Type: "invoke", Op: op, RunID: id.RunID, Epoch: id.Epoch,
		Revision: id.Revision, OperationID: id.OperationID, EventID: id.EventID, Detail: detail})
	return func(err error, after ids) {
		e := injection.Event{Type: "ok", Op: op, RunID: id.RunID, Epoch: id.Epoch, Revision: id.Revision,
			OperationID: id.OperationID, EventID: id.EventID, Detail: detail}
		if after.RunID != "" {
			e.RunID = after.RunID
		}
		if after.Epoch != nil {
			e.Epoch = after.Epoch
		}
		if after.Revision != nil {
			e.Revision = after.Revision
		}
		if after.OperationID != "" {
			e.OperationID = after.OperationID
		}
		if err != nil {
			e.Error = protocol.ClassOf(err)
			e.Type = "fail"
			if e.Error == "CommitOutcomeUnknown" || (protocol.IsConnectionError(err) && e.Error != "ExecutionCancelled") {
				e.Type = "info"
			}
		}
		injection.Record(e)
	}
}

func i64(v int64) *int64 { return &v }
