package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Checkpoint schema versions (rule 13; Chinese seed section 6: check
// schema_version, never parse silently into zero values).
//
// Version 2 (what the built-in workflow writes):
//
//	{"workflow": "refund", "plan": [...], "cursor": n, "data": {...},
//	 "results": {...}, "pending": {...} | null}
//
// Version 1 (older workers): {"step": "<next step>", "done": [...], "vars": {...}}.
// Migration 1 -> 2: plan = done + the default plan from step on; cursor =
// len(done); data = vars; results = {}; pending = null. A v1 state missing
// any of its fields is refused, not defaulted. Any other version is refused
// with SchemaVersionUnknown; a state whose hash does not match, with
// CheckpointCorrupt.
const CurrentSchemaVersion = 2

// DefaultPlan is the built-in refund workflow's plan.
var DefaultPlan = []string{"plan", "lookup", "create_label", "notify", "finish"}

// Checkpoint is a stored checkpoint decoded into the current version.
type Checkpoint struct {
	Revision      int64
	SchemaVersion int // as stored
	State         map[string]any
	MigratedFrom  int // 0 when stored in the current version
}

func require(state map[string]any, key string, version int, ok func(any) bool) (any, error) {
	v, present := state[key]
	if !present || !ok(v) {
		return nil, newErr("SchemaVersionUnknown", "malformed",
			"checkpoint v%d lacks a valid %q: refused, not defaulted", version, key)
	}
	return v, nil
}

func isList(v any) bool   { _, ok := v.([]any); return ok }
func isObject(v any) bool { _, ok := v.(map[string]any); return ok }
func isString(v any) bool { _, ok := v.(string); return ok }
func isInt(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	_, err := n.Int64()
	return err == nil
}

// MigrateV1 is the explicit 1 -> 2 migration.
func MigrateV1(state map[string]any) (map[string]any, error) {
	step, err := require(state, "step", 1, isString)
	if err != nil {
		return nil, err
	}
	done, err := require(state, "done", 1, isList)
	if err != nil {
		return nil, err
	}
	data, err := require(state, "vars", 1, isObject)
	if err != nil {
		return nil, err
	}
	plan := append([]any{}, done.([]any)...)
	seen := map[string]bool{}
	for _, d := range plan {
		if s, ok := d.(string); ok {
			seen[s] = true
		}
	}
	rest := []string{step.(string)}
	for i, s := range DefaultPlan {
		if s == step.(string) {
			rest = DefaultPlan[i:]
		}
	}
	for _, s := range rest {
		if !seen[s] {
			plan = append(plan, s)
		}
	}
	return map[string]any{
		"workflow": "refund",
		"plan":     plan,
		"cursor":   json.Number(fmt.Sprint(len(done.([]any)))),
		"data":     data,
		"results":  map[string]any{},
		"pending":  nil,
	}, nil
}

// ValidateV2 checks the fields the workflow resumes from; refuses rather than defaults.
func ValidateV2(state map[string]any) error {
	plan, err := require(state, "plan", 2, isList)
	if err != nil {
		return err
	}
	cursor, err := require(state, "cursor", 2, isInt)
	if err != nil {
		return err
	}
	if _, err := require(state, "data", 2, isObject); err != nil {
		return err
	}
	if _, err := require(state, "results", 2, isObject); err != nil {
		return err
	}
	c, _ := cursor.(json.Number).Int64()
	if c < 0 || c > int64(len(plan.([]any))) {
		return newErr("SchemaVersionUnknown", "malformed", "checkpoint v2 cursor out of range")
	}
	return nil
}

// DecodeCheckpoint turns a stored checkpoint into a current-version one, or
// refuses it.
func DecodeCheckpoint(revision int64, schemaVersion *int32, raw []byte, storedHash []byte) (Checkpoint, error) {
	if schemaVersion == nil || (*schemaVersion != 1 && *schemaVersion != CurrentSchemaVersion) {
		v := "none"
		if schemaVersion != nil {
			v = fmt.Sprint(*schemaVersion)
		}
		return Checkpoint{}, newErr("SchemaVersionUnknown", v,
			"checkpoint schema_version %s is unknown to this worker (knows [1 2]): refused", v)
	}
	decoded, err := Decode(raw)
	if err != nil {
		return Checkpoint{}, newErr("SchemaVersionUnknown", "malformed", "checkpoint state is not JSON: %v", err)
	}
	state, ok := decoded.(map[string]any)
	if !ok {
		return Checkpoint{}, newErr("SchemaVersionUnknown", "malformed", "checkpoint state is not an object")
	}
	if storedHash != nil {
		canon, err := Canonical(state)
		if err != nil || !bytes.Equal(StateHash(canon), storedHash) {
			return Checkpoint{}, newErr("CheckpointCorrupt", "hash",
				"checkpoint revision %d: state does not match its hash", revision)
		}
	}
	if *schemaVersion == CurrentSchemaVersion {
		return Checkpoint{revision, int(*schemaVersion), state, 0}, nil
	}
	migrated, err := MigrateV1(state)
	if err != nil {
		return Checkpoint{}, err
	}
	return Checkpoint{revision, 1, migrated, 1}, nil
}
