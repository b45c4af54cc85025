package worker

import (
	"fmt"
	"testing"
)

func TestUnreportedKeepsTakesAndBounds(t *testing.T) {
	u := newUnreported()
	u.keep("", []byte("no id")) // not kept: nothing could find it
	u.keep("o:a:1:1", []byte("a1"))
	if b, ok := u.take("o:a:1:1"); !ok || string(b) != "a1" {
		t.Fatalf("take = %q %v, want a1", b, ok)
	}
	if _, ok := u.take("o:a:1:1"); ok {
		t.Fatal("taken twice")
	}
	for i := range unreportedMax + 10 {
		u.keep(fmt.Sprintf("o:t%d:1:1", i), []byte{byte(i)})
	}
	if n := u.len(); n != unreportedMax {
		t.Fatalf("%d kept, want the bound %d", n, unreportedMax)
	}
	if _, ok := u.take("o:t0:1:1"); ok {
		t.Fatal("the oldest was kept past the bound")
	}
	if _, ok := u.take(fmt.Sprintf("o:t%d:1:1", unreportedMax+9)); !ok {
		t.Fatal("the newest was not kept")
	}
	for i := range 3 * unreportedMax { // keep and take: order does not grow without bound
		id := fmt.Sprintf("o:x%d:1:1", i)
		u.keep(id, nil)
		u.take(id)
	}
	if len(u.order) > 2*unreportedMax+1 {
		t.Fatalf("order holds %d ids", len(u.order))
	}
}
