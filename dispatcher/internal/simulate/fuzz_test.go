package simulate

import (
	"bytes"
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

// Whatever the log, Fit returns a scenario that loads with its trace, or
// an error wrapping ErrFit; it never panics.
func FuzzFit(f *testing.F) {
	f.Add([]byte("time,type,tenant,model,node,attempt,status,latency_ms,size\n0.5,t,a,m,n,1,success,12.5,3\n1,t,b,m,n,2,timeout,2000,0\n"))
	f.Add([]byte("TIMESTAMP,model,status\n2023-11-16 18:17:03.9799600,m,ok\n"))
	f.Add([]byte("model\n\n"))
	f.Add([]byte("time\n1e308\n"))
	f.Add([]byte("latency_ms,size\n1,1e12\n0,0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := Fit(bytes.NewReader(data), FitOptions{})
		if err != nil {
			if !errors.Is(err, ErrFit) {
				t.Fatalf("error %v does not wrap ErrFit", err)
			}
			return
		}
		if _, err := parseScenario(res.Scenario, func(string) ([]byte, error) { return res.Trace, nil }); err != nil {
			t.Fatalf("fitted scenario does not load: %v\n%s", err, res.Scenario)
		}
	})
}

// Whatever the bytes, a trace parses or gives an error; it never panics.
func FuzzParseTrace(f *testing.F) {
	f.Add([]byte("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n2023-11-16 18:17:04.0319600,3180\n"))
	f.Add([]byte("t,s\n0,1\n-5,2\n1e9,3\n"))
	f.Add([]byte("t\n\"unterminated\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []float64{1, 0.5, 3} {
			tr, err := parseTrace(data, &Arrival{Trace: "f", SizeColumn: "s", TimeScale: 1, RateMultiplier: m})
			if err == nil && (len(tr.at) == 0 || len(tr.size) != len(tr.at) || m == 1 && tr.at[0] != 0) {
				t.Fatalf("trace of %d arrivals, %d sizes, first at %v", len(tr.at), len(tr.size), tr.at[0])
			}
		}
	})
}
