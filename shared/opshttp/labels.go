package opshttp

import (
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Overflow is the label value that stands for every value past a Children
// cap: label values come from the wire (task types, model and node names),
// and a misbehaving producer must not be able to grow a series per message.
const Overflow = "_other"

// DefaultMaxChildren bounds the distinct label-value combinations of one
// metric vector.
const DefaultMaxChildren = 1000

// Children caches the children of a metric vector by label values, so that
// the hot path resolves a child with one map read (no hashing of label values
// by client_golang, no allocation) and the number of series stays bounded.
// K is the label values as a comparable key (a string, or a struct of them).
type Children[K comparable, M any] struct {
	mu      sync.RWMutex
	m       map[K]M
	max     int
	resolve func(K) M
	over    M
	hasOver bool
	overKey K
}

// NewChildren returns a cache resolving a key with resolve (typically
// vec.WithLabelValues) up to max distinct keys (DefaultMaxChildren when
// max <= 0); past it every new key maps to overflow's child.
func NewChildren[K comparable, M any](max int, resolve func(K) M, overflow K) *Children[K, M] {
	if max <= 0 {
		max = DefaultMaxChildren
	}
	return &Children[K, M]{m: map[K]M{}, max: max, resolve: resolve, overKey: overflow}
}

// Get returns the child of k.
func (c *Children[K, M]) Get(k K) M {
	c.mu.RLock()
	m, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return m
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.m[k]; ok {
		return m
	}
	if len(c.m) >= c.max {
		if !c.hasOver {
			c.over, c.hasOver = c.resolve(c.overKey), true
		}
		return c.over
	}
	m = c.resolve(k)
	c.m[k] = m
	return m
}

// Counter1 is a Children of a one-label counter vector.
func Counter1(v *prometheus.CounterVec) *Children[string, prometheus.Counter] {
	return NewChildren(0, func(k string) prometheus.Counter { return v.WithLabelValues(LabelValue(k)) }, Overflow)
}

// Observer1 is a Children of a one-label histogram vector.
func Observer1(v *prometheus.HistogramVec) *Children[string, prometheus.Observer] {
	return NewChildren(0, func(k string) prometheus.Observer { return v.WithLabelValues(LabelValue(k)) }, Overflow)
}

// L2 and L3 are keys of two and three label values.
type (
	L2 struct{ A, B string }
	L3 struct{ A, B, C string }
)

// Counter2 is a Children of a two-label counter vector.
func Counter2(v *prometheus.CounterVec) *Children[L2, prometheus.Counter] {
	return NewChildren(0, func(k L2) prometheus.Counter { return v.WithLabelValues(LabelValue(k.A), LabelValue(k.B)) }, L2{Overflow, Overflow})
}

// Counter3 is a Children of a three-label counter vector.
func Counter3(v *prometheus.CounterVec) *Children[L3, prometheus.Counter] {
	return NewChildren(0, func(k L3) prometheus.Counter {
		return v.WithLabelValues(LabelValue(k.A), LabelValue(k.B), LabelValue(k.C))
	},
		L3{Overflow, Overflow, Overflow})
}

// LabelValue makes s a valid label value: client_golang panics on invalid
// UTF-8, and these values come from the wire. Empty becomes "unknown".
func LabelValue(s string) string {
	if s == "" {
		return "unknown"
	}
	if !utf8.ValidString(s) {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	return s
}
