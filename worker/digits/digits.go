// Package digits is a handwritten-digit classifier that needs only Go: a
// softmax regression trained at first use on a compact copy of the 8x8
// digits dataset that scikit-learn bundles (digits.txt.gz, 47 KB; its
// attribution is in the file's header and in docs/models.md). It lets the
// demo and tests show a model that really computes, next to simulated ones.
//
// The model trains on the images whose index is not a multiple of
// HoldoutEvery and is judged on the others, which it has never seen.
package digits

import (
	"bufio"
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
)

// Pixels is the number of pixels of an image (8x8); each is 0..16.
const Pixels = 64

// Classes are the labels 0..9.
const Classes = 10

// HoldoutEvery: images whose index is a multiple of it are held out of
// training, to measure accuracy (as deployments/models/digits_server.py does).
const HoldoutEvery = 4

//go:embed digits.txt.gz
var compressed []byte

// Sample is one labelled image.
type Sample struct {
	Label  int
	Pixels [Pixels]float64
}

// Dataset returns the 1797 images of the embedded dataset, in order.
var Dataset = sync.OnceValues(func() ([]Sample, error) { return parse(compressed) })

func parse(gz []byte) ([]Sample, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("digits dataset: %w", err)
	}
	var out []Sample
	sc := bufio.NewScanner(zr)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		label, px, ok := strings.Cut(line, " ")
		if !ok || len(label) != 1 || label[0] < '0' || label[0] > '9' || len(px) != Pixels {
			return nil, fmt.Errorf("digits dataset: line %d is not a label and %d pixels", n, Pixels)
		}
		s := Sample{Label: int(label[0] - '0')}
		for i := range Pixels {
			c := px[i]
			switch {
			case c >= '0' && c <= '9':
				s.Pixels[i] = float64(c - '0')
			case c >= 'a' && c <= 'g':
				s.Pixels[i] = float64(c-'a') + 10
			default:
				return nil, fmt.Errorf("digits dataset: line %d: pixel %d is %q", n, i, c)
			}
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("digits dataset: %w", err)
	}
	return out, zr.Close()
}

// Split returns the training images and the held-out ones.
func Split(all []Sample) (train, holdout []Sample) {
	for i, s := range all {
		if i%HoldoutEvery == 0 {
			holdout = append(holdout, s)
		} else {
			train = append(train, s)
		}
	}
	return train, holdout
}

// Model is a softmax regression over the 64 pixels scaled to 0..1.
type Model struct {
	w [Classes][Pixels + 1]float64 // last column: bias
}

// Train fits a model by mini-batch gradient descent; seed makes it
// reproducible.
func Train(samples []Sample, epochs int, seed uint64) *Model {
	m := &Model{}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	order := make([]int, len(samples))
	for i := range order {
		order[i] = i
	}
	const batch, rate, l2 = 16, 0.5, 1e-4
	var grad [Classes][Pixels + 1]float64
	var x [Pixels + 1]float64
	for range epochs {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for start := 0; start < len(order); start += batch {
			grad = [Classes][Pixels + 1]float64{}
			end := min(start+batch, len(order))
			for _, idx := range order[start:end] {
				s := &samples[idx]
				features(&s.Pixels, &x)
				p := m.probs(&x)
				for c := range Classes {
					g := p[c]
					if c == s.Label {
						g--
					}
					for j := range x {
						grad[c][j] += g * x[j]
					}
				}
			}
			scale := rate / float64(end-start)
			for c := range Classes {
				for j := range x {
					m.w[c][j] -= scale*grad[c][j] + rate*l2*m.w[c][j]
				}
			}
		}
	}
	return m
}

func features(px *[Pixels]float64, x *[Pixels + 1]float64) {
	for i, v := range px {
		x[i] = v / 16
	}
	x[Pixels] = 1
}

func (m *Model) probs(x *[Pixels + 1]float64) [Classes]float64 {
	var z [Classes]float64
	top := math.Inf(-1)
	for c := range Classes {
		for j, v := range x {
			z[c] += m.w[c][j] * v
		}
		top = max(top, z[c])
	}
	var sum float64
	for c := range z {
		z[c] = math.Exp(z[c] - top)
		sum += z[c]
	}
	for c := range z {
		z[c] /= sum
	}
	return z
}

// Predict returns the most likely label and every label's probability.
func (m *Model) Predict(px [Pixels]float64) (int, [Classes]float64) {
	var x [Pixels + 1]float64
	features(&px, &x)
	p := m.probs(&x)
	best := 0
	for c := range p {
		if p[c] > p[best] {
			best = c
		}
	}
	return best, p
}

// Accuracy is the share of samples whose label the model predicts.
func (m *Model) Accuracy(samples []Sample) float64 {
	if len(samples) == 0 {
		return 0
	}
	ok := 0
	for _, s := range samples {
		if l, _ := m.Predict(s.Pixels); l == s.Label {
			ok++
		}
	}
	return float64(ok) / float64(len(samples))
}

// Default is the model trained once, at first use, on the training split.
var Default = sync.OnceValues(func() (*Model, error) {
	all, err := Dataset()
	if err != nil {
		return nil, err
	}
	train, _ := Split(all)
	return Train(train, 40, 1), nil
})
