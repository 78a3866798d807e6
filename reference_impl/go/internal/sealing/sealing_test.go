package sealing

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"testing"
)

func newSealer(t *testing.T) *Sealer {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	s, err := New(base64.StdEncoding.EncodeToString(key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// An object naming the mark is kept only when it is a sealed value of ours.
func TestForgedSealedValuesAreRefused(t *testing.T) {
	s := newSealer(t)
	other, err := newSealer(t).Seal(map[string]any{"customer_token": "ct_2"})
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"clear token": map[string]any{"card_number": map[string]any{"$sealed": "ct_in_clear"}},
		"beside mark": map[string]any{"billing": map[string]any{"$sealed": "v1:AAAA", "payment_token": "ct_b"}},
		"another key": other,
		"no string":   map[string]any{"notes": map[string]any{"$sealed": 42.0}},
	} {
		if _, err := s.Seal(v); !errors.Is(err, ErrForged) {
			t.Errorf("%s: want ErrForged, got %v", name, err)
		}
	}
	sealed, err := s.Seal(map[string]any{"customer_token": "ct_1"})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Seal(sealed); err != nil || again.(map[string]any)["customer_token"] == nil {
		t.Errorf("a value sealed by us is kept: %v", err)
	}
	if _, err := (&Sealer{}).Seal(sealed); err != nil {
		t.Errorf("a worker without a key carries a sealed value: %v", err)
	}
}
