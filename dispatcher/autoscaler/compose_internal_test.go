package autoscaler

import "testing"

// compose ps --format json prints one object per line since v2.21 and an
// array before: both are read; anything else is an error, not a crash.
func TestParsePS(t *testing.T) {
	lines := `{"ID":"0123456789abcdef","Name":"p-worker-1","Service":"worker","State":"running"}
{"ID":"fedcba9876543210","Name":"p-nats-1","Service":"nats","State":"running"}
`
	array := `[{"ID":"0123456789abcdef","Name":"p-worker-1","Service":"worker","State":"running"},{"ID":"x","Name":"p-worker-2","Service":"worker","State":"exited"}]`
	for name, in := range map[string]string{"lines": lines, "array": array} {
		cs, err := parsePS([]byte(in))
		if err != nil || len(cs) != 2 || cs[0].Service != "worker" || shortID(cs[0].ID) != "0123456789ab" {
			t.Errorf("%s: %+v %v", name, cs, err)
		}
	}
	if cs, err := parsePS(nil); err != nil || cs != nil {
		t.Errorf("empty: %+v %v", cs, err)
	}
	if _, err := parsePS([]byte("{not json")); err == nil {
		t.Error("garbage: no error")
	}
}

func TestKVKey(t *testing.T) {
	for in, want := range map[string]string{"worker": "worker", "worker-digits": "worker-digits",
		"models:a,b@v2": "models_a_b_v2", "": "_"} {
		if got := KVKey(in); got != want {
			t.Errorf("KVKey(%q) = %q, want %q", in, got, want)
		}
	}
}
