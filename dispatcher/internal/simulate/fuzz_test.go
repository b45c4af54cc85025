package simulate

import (
	"context"
	"errors"
	"testing"
)

// Whatever the bytes, ParseScenario returns a scenario or a *ScenarioError,
// never panics, and an accepted scenario runs to completion.
func FuzzParseScenario(f *testing.F) {
	for _, name := range Builtin() {
		b, err := BuiltinJSON(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(minimal))
	f.Add([]byte(`{"arrival": {"rate": 1e-300, "types": {"t": 1}}}`))
	f.Add([]byte(`{"tasks": 1e12}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"models": [{"name": "m", "profile": [{"at": "-1s"}]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := ParseScenario(data)
		if err != nil {
			var se *ScenarioError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalidScenario) {
				t.Fatalf("error %v is not a *ScenarioError", err)
			}
			return
		}
		_, err = Run(context.Background(), sc, Options{Tasks: 50, Policies: []string{"reliability"}})
		if err != nil && !errors.Is(err, ErrInvalidOptions) {
			t.Fatalf("accepted scenario failed to run: %v", err)
		}
	})
}
