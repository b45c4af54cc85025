package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/shared/protocol"
	"github.com/mlsched/mlsched/shared/topology"
)

// nodeRow is one bucket entry: a heartbeat, or why it is not one.
type nodeRow struct {
	Key       string              `json:"key"`
	Heartbeat *protocol.Heartbeat `json:"heartbeat,omitempty"`
	Error     string              `json:"error,omitempty"`
}

func runNodes(ctx context.Context, a *app, args []string) error {
	fs := a.newFlags("nodes", "nodes [-json]")
	raw := fs.Bool("json", false, "print one JSON line per node")
	if err := a.parseAndConnect(fs, args); err != nil {
		return err
	}
	cx, cancel := a.reqCtx(ctx)
	defer cancel()
	rows, err := a.listNodes(cx)
	if err != nil {
		return err
	}
	if *raw {
		for _, r := range rows {
			writeJSON(a.stdout, r)
		}
		return nil
	}
	if len(rows) == 0 {
		fmt.Fprintln(a.stdout, "no live nodes")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	// HOST next to the node id (for a pool worker a 56-character key): the
	// name the node announces, which an operator recognises (a container's
	// short id, as docker ps shows it).
	fmt.Fprintln(tw, "NODE\tHOST\tMODELS\tCAPACITY\tIN-FLIGHT\tLAST SEEN\tSTATE")
	for _, r := range rows {
		if r.Heartbeat == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tinvalid heartbeat: %s\n", r.Key, r.Error)
			continue
		}
		h := r.Heartbeat
		state := "ready"
		if h.Draining {
			state = "draining"
		}
		host := h.HostName()
		if host == "" {
			host = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s ago\t%s\n", r.Key, host, modelList(h.Models), h.Capacity, h.InFlight,
			now.Sub(h.SentAt).Round(100*time.Millisecond), state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Hosted models the nodes do not announce now, and why.
	for _, r := range rows {
		if r.Heartbeat != nil {
			for _, u := range r.Heartbeat.Unready {
				fmt.Fprintf(a.stdout, "%s: model %s not ready: %s\n", r.Key, u.Name, u.Reason)
			}
		}
	}
	return nil
}

// listNodes reads every live entry of the node bucket, sorted by key.
func (a *app) listNodes(ctx context.Context) ([]nodeRow, error) {
	kv, err := a.js.KeyValue(ctx, topology.BucketNodes)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil // no worker ever started
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", topology.BucketNodes, err)
	}
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", topology.BucketNodes, err)
	}
	sort.Strings(keys)
	rows := make([]nodeRow, 0, len(keys))
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or deleted since listing
		}
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", k, err)
		}
		var h protocol.Heartbeat
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			rows = append(rows, nodeRow{Key: k, Error: err.Error()})
			continue
		}
		rows = append(rows, nodeRow{Key: k, Heartbeat: &h})
	}
	return rows, nil
}

func modelList(ms []protocol.ModelInfo) string {
	if len(ms) == 0 {
		return "-"
	}
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = m.Name
		if len(m.Types) > 0 {
			parts[i] += "(" + strings.Join(m.Types, ",") + ")"
		}
		if m.Replaces != "" {
			parts[i] += "[replaces " + m.Replaces + "]"
		}
	}
	return strings.Join(parts, " ")
}
