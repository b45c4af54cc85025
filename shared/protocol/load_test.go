package protocol

import (
	"strings"
	"testing"
)

func TestLoadShareRoundTrip(t *testing.T) {
	in := LoadShare{Replica: "a1b2", Pairs: []LoadDelta{{Model: "m10", Node: "fast", Delta: 3}, {Model: "m500", Node: "slow", Delta: -2}}}
	data, err := EncodeLoadShare(&in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeLoadShare(data)
	if err != nil {
		t.Fatal(err)
	}
	if out.Replica != in.Replica || len(out.Pairs) != 2 || out.Pairs[1] != in.Pairs[1] {
		t.Fatalf("got %+v, want %+v", out, in)
	}
}

func TestDecodeLoadShareRefuses(t *testing.T) {
	for _, c := range []struct{ data, want string }{
		{`{`, "load share"},
		{`{"r":"","p":[]}`, "replica id"},
		{`{"r":"a b","p":[]}`, "replica id"},
		{`{"r":"x","p":[{"m":"","n":"n1","d":1}]}`, "model"},
		{`{"r":"x","p":[{"m":"m","n":"a.b","d":1}]}`, "node"},
		{`{"r":"x","p":[{"m":"m","n":"n1","d":2000000}]}`, "delta"},
		{`{"r":"x","p":[{"m":"m","n":"n1","d":-2000000}]}`, "delta"},
	} {
		if _, err := DecodeLoadShare([]byte(c.data)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", c.data, err, c.want)
		}
	}
	many := `{"r":"x","p":[` + strings.Repeat(`{"m":"m","n":"n","d":1},`, MaxLoadPairs) + `{"m":"m","n":"n","d":1}]}`
	if _, err := DecodeLoadShare([]byte(many)); err == nil || !strings.Contains(err.Error(), "pairs") {
		t.Errorf("%d pairs: error %v, want one naming the pairs", MaxLoadPairs+1, err)
	}
}
