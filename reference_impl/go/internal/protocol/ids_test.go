package protocol_test

import (
	"encoding/json"
	"errors"
	"testing"

	"fencecheck/goworker/internal/protocol"
	"fencecheck/goworker/internal/tool"
)

func toolAnswer(rid string) tool.Answer {
	return tool.Answer{Kind: "succeeded", RemoteID: &rid, Result: map[string]any{"resource_id": rid}}
}

// The canonical form must be byte for byte what Python's
// json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) gives,
// so request digests agree with the mock tool's body_digest.
func TestCanonicalJSONMatchesPython(t *testing.T) {
	v, _ := protocol.Decode([]byte(`{"b": [1, 2.5, "x<y>&"], "a": {"é": null, "n": true}, "c": "line\nbreak"}`))
	got, err := protocol.Canonical(v)
	want := `{"a":{"n":true,"é":null},"b":[1,2.5,"x<y>&"],"c":"line\nbreak"}`
	if err != nil || string(got) != want {
		t.Fatalf("canonical %s, want %s (%v)", got, want, err)
	}
	d, _ := protocol.RequestDigest(map[string]any{"amount": 5})
	// hashlib.sha256(b'{"amount":5}').hexdigest()
	if d != "7e84cbf0f7a7c92c037058665d66152f8eb8580ab2534e52c877bccceb9cc7bf" {
		t.Fatalf("digest %s", d)
	}
}

func TestOperationIDIsTheIntentOnly(t *testing.T) {
	a := protocol.OperationID("t", "r", "create_label", 1)
	if a != "t/r/create_label/v1" || a != protocol.OperationID("t", "r", "create_label", 1) {
		t.Fatalf("operation id %q is not a pure function of the intent", a)
	}
}

func TestCheckpointVersions(t *testing.T) {
	v1 := []byte(`{"step": "create_label", "done": ["plan", "lookup"], "vars": {"order_id": "o", "amount": 42}}`)
	one, two := int32(1), int32(2)
	ck, err := protocol.DecodeCheckpoint(3, &one, v1, nil)
	if err != nil || ck.MigratedFrom != 1 || ck.State["cursor"].(json.Number).String() != "2" {
		t.Fatalf("v1 migration: %+v %v", ck, err)
	}
	plan, _ := json.Marshal(ck.State["plan"])
	if string(plan) != `["plan","lookup","create_label","notify","finish"]` {
		t.Fatalf("migrated plan %s", plan)
	}
	ninetyNine := int32(99)
	if _, err := protocol.DecodeCheckpoint(3, &ninetyNine, v1, nil); !errors.Is(err, protocol.ErrSchemaVersionUnknown) {
		t.Fatalf("version 99: %v; want SchemaVersionUnknown", err)
	}
	if _, err := protocol.DecodeCheckpoint(3, nil, v1, nil); !errors.Is(err, protocol.ErrSchemaVersionUnknown) {
		t.Fatalf("no version: %v; want SchemaVersionUnknown", err)
	}
	if _, err := protocol.DecodeCheckpoint(3, &one, []byte(`{"step": "plan"}`), nil); !errors.Is(err, protocol.ErrSchemaVersionUnknown) {
		t.Fatalf("v1 missing fields: %v; want a refusal, not defaults", err)
	}
	if _, err := protocol.DecodeCheckpoint(3, &two, []byte(`{"a": 1}`), []byte("not the hash")); !errors.Is(err, protocol.ErrCheckpointCorrupt) {
		t.Fatalf("hash mismatch: %v; want CheckpointCorrupt", err)
	}
}
