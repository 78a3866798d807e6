package mutants

import (
	"reflect"
	"testing"

	"fencecheck/goworker/internal/protocol"
)

// Every mutant and seed variant loads, and changes exactly one place: one
// statement, one field of the protocol, or one database overlay.
func TestEveryMutantChangesOnePlace(t *testing.T) {
	correct := protocol.Correct()
	for _, m := range append(append([]Mutant{}, Registry...), SeedVariants...) {
		p, overlays, err := Load(m.Name)
		if err != nil {
			t.Fatalf("%s: %v", m.Name, err)
		}
		changed := len(overlays)
		cs, ms := reflect.ValueOf(correct.SQL), reflect.ValueOf(p.SQL)
		for i := 0; i < cs.NumField(); i++ {
			if cs.Field(i).String() != ms.Field(i).String() {
				changed++
			}
		}
		cv, mv := reflect.ValueOf(*correct), reflect.ValueOf(*p)
		for i := 0; i < cv.NumField(); i++ {
			if cv.Type().Field(i).Type.Kind() == reflect.Func && cv.Field(i).Pointer() != mv.Field(i).Pointer() {
				changed++
			}
		}
		if p.LockInOwnTx != correct.LockInOwnTx {
			changed++
		}
		if changed != 1 {
			t.Errorf("%s changes %d places, want exactly 1", m.Name, changed)
		}
		if len(m.Catchers) == 0 || m.Description == "" {
			t.Errorf("%s names no catcher or no description", m.Name)
		}
	}
	if len(Registry) < 8 {
		t.Errorf("%d mutants; the issue asks for at least 8", len(Registry))
	}
	if _, _, err := Load("no_such_mutant"); err == nil {
		t.Error("an unknown name was accepted")
	}
}
