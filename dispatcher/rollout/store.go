package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNotFound is returned for a family without a rollout.
var ErrNotFound = errors.New("no rollout")

// Store keeps rollouts in the MLSCHED_ROLLOUTS KV bucket, one key per
// family. Every change is a compare-and-set on the key's revision, so
// that replicas and operators never overwrite each other's counts or
// commands.
type Store struct{ KV jetstream.KeyValue }

// Get returns a family's rollout and its revision.
func (s Store) Get(ctx context.Context, family string) (*Rollout, uint64, error) {
	e, err := s.KV.Get(ctx, family)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w for family %q", ErrNotFound, family)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("rollout of %q: %w", family, err)
	}
	r, err := Decode(e.Value())
	if err != nil {
		return nil, 0, fmt.Errorf("rollout of %q: %w", family, err)
	}
	return r, e.Revision(), nil
}

// Decode reads a stored rollout.
func Decode(data []byte) (*Rollout, error) {
	var r Rollout
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(r.Steps) == 0 || r.Step < 0 || r.Step >= len(r.Steps) {
		return nil, fmt.Errorf("%w: step %d of %d", ErrInvalid, r.Step, len(r.Steps))
	}
	return &r, nil
}

// Update applies f to a family's rollout (nil when it has none) and
// stores what f returns, retrying f on a concurrent change; f returning
// nil stores nothing.
func (s Store) Update(ctx context.Context, family string, f func(*Rollout) (*Rollout, error)) (*Rollout, error) {
	for range 20 {
		cur, rev, err := s.Get(ctx, family)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		next, err := f(cur)
		if err != nil || next == nil {
			return next, err
		}
		data, err := json.Marshal(next)
		if err != nil {
			return nil, err
		}
		if rev == 0 {
			_, err = s.KV.Create(ctx, family, data)
		} else {
			_, err = s.KV.Update(ctx, family, data, rev)
		}
		if err == nil {
			return next, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return nil, fmt.Errorf("rollout of %q: %w", family, err)
		}
	}
	return nil, fmt.Errorf("rollout of %q: too many concurrent changes", family)
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// List returns every family's rollout, sorted by family.
func (s Store) List(ctx context.Context) ([]*Rollout, error) {
	keys, err := s.KV.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	sort.Strings(keys)
	var out []*Rollout
	for _, k := range keys {
		r, _, err := s.Get(ctx, k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
