package jsplumb_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/mlsched/mlsched/shared/jsplumb"
	"github.com/mlsched/mlsched/shared/topology"
)

// A start-up step is retried while JetStream is unavailable (503 during a
// cluster election, no responders, timeouts) and not for other errors.
func TestDo(t *testing.T) {
	t.Parallel()
	unavailable := &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
	for _, tc := range []struct {
		name      string
		errs      []error // returned by the attempts in turn, then nil
		wantCalls int
		wantErr   error
	}{
		{"503 then ok", []error{fmt.Errorf("consumer node-x: %w", unavailable), unavailable}, 3, nil},
		{"no responders then ok", []error{nats.ErrNoResponders}, 2, nil},
		{"timeout then ok", []error{context.DeadlineExceeded}, 2, nil},
		{"incompatible stops", []error{topology.ErrIncompatible}, 1, topology.ErrIncompatible},
		{"no peers for placement then ok", []error{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}}, 2, nil},
		{"not found stops", []error{&jetstream.APIError{Code: 404, ErrorCode: 10059}}, 1, jetstream.ErrStreamNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			calls := 0
			err := jsplumb.Retry(context.Background(), zerolog.Nop(), "step", func(ctx context.Context) error {
				calls++
				if _, ok := ctx.Deadline(); !ok {
					t.Error("an attempt runs without a deadline")
				}
				if calls <= len(tc.errs) {
					return tc.errs[calls-1]
				}
				return nil
			})
			if calls != tc.wantCalls {
				t.Errorf("%d attempts, want %d", calls, tc.wantCalls)
			}
			if (tc.wantErr == nil) != (err == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// A worker asked to stop while JetStream stays unavailable stops retrying.
func TestDoStopsWithCtx(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan error, 1)
	go func() {
		done <- jsplumb.Retry(ctx, zerolog.Nop(), "step", func(context.Context) error {
			calls++
			if calls == 2 {
				cancel()
			}
			return &jetstream.APIError{Code: 503}
		})
	}()
	select {
	case err := <-done:
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != 503 {
			t.Fatalf("err = %v, want the last 503", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Do did not stop when ctx ended")
	}
}
