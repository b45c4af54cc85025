package simulate

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

func TestZZDebug(t *testing.T) {
	name := os.Getenv("ZZ_SC")
	if name == "" {
		t.Skip()
	}
	sc, _ := Load(name)
	opt := Options{Seed: 1}.withDefaults(sc)
	if os.Getenv("ZZ_MS") != "" {
		fmt.Sscan(os.Getenv("ZZ_MS"), &opt.Engine.MinSamples)
	}
	s, err := newSim(sc, opt, os.Getenv("ZZ_POL"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.run(context.Background(), sc.Tasks); err != nil {
		t.Fatal(err)
	}
	var reg [30]float64
	var cnt [30]int
	for _, r := range s.tasks {
		b := int(r.submit / (10 * time.Second))
		if b < 30 {
			reg[b] += r.pFirst - r.pBest
			cnt[b]++
		}
	}
	for i := range reg {
		if cnt[i] > 0 {
			fmt.Printf("%3ds regret %.2fpp\n", i*10, reg[i]/float64(cnt[i])*100)
		}
	}
}
