package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"
)

// ServerMsgs is what nats-server itself counted over the throughput phase,
// per task: the messages and bytes it received from its clients (in) and
// sent to them (out), in all and per connection role. It is the protocol's
// cost, read from the server's own statistics (/varz, /connz) rather than
// inferred from the code: issue 46 asks for it.
type ServerMsgs struct {
	InMsgs   float64 `json:"in_msgs_per_task"`
	OutMsgs  float64 `json:"out_msgs_per_task"`
	InBytes  float64 `json:"in_bytes_per_task"`
	OutBytes float64 `json:"out_bytes_per_task"`
	// ByRole is per connection role (connRole: "dispatcher", "worker",
	// "relay", "sink", "producer", "receiver").
	ByRole map[string]MsgCount `json:"by_role,omitempty"`
}

// MsgCount is one role's messages per task, as the server counts them:
// In is what the role published (to the server), Out what the server
// delivered to it.
type MsgCount struct {
	In  float64 `json:"in"`
	Out float64 `json:"out"`
}

type serverCounts struct {
	in, out, inB, outB int64
	byRole             map[string][2]int64
}

// readServerCounts reads /varz and /connz of the server at monitorURL.
// Closed connections are not in /connz: the counts cover the connections
// open at both reads, which in a bench run are all of them.
func readServerCounts(ctx context.Context, monitorURL string) (serverCounts, error) {
	var v struct {
		InMsgs   int64 `json:"in_msgs"`
		OutMsgs  int64 `json:"out_msgs"`
		InBytes  int64 `json:"in_bytes"`
		OutBytes int64 `json:"out_bytes"`
	}
	if err := getJSON(ctx, monitorURL+"/varz", &v); err != nil {
		return serverCounts{}, err
	}
	var c struct {
		Connections []struct {
			Name    string `json:"name"`
			InMsgs  int64  `json:"in_msgs"`
			OutMsgs int64  `json:"out_msgs"`
		} `json:"connections"`
	}
	if err := getJSON(ctx, monitorURL+"/connz?limit=1024", &c); err != nil {
		return serverCounts{}, err
	}
	sc := serverCounts{in: v.InMsgs, out: v.OutMsgs, inB: v.InBytes, outB: v.OutBytes, byRole: map[string][2]int64{}}
	for _, cn := range c.Connections {
		r := connRole(cn.Name)
		x := sc.byRole[r]
		sc.byRole[r] = [2]int64{x[0] + cn.InMsgs, x[1] + cn.OutMsgs}
	}
	return sc, nil
}

// connRole is a connection name's role: its first word after an
// "mlsched-" or "bench-" prefix ("mlsched-worker-node-3" is "worker",
// "bench-sink-node-1" is "sink"; unnamed ones are "other").
func connRole(name string) string {
	name = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(name), "mlsched-"), "bench-")
	if name == "" {
		return "other"
	}
	if i := strings.IndexAny(name, " -:("); i > 0 {
		return name[:i]
	}
	return name
}

// perTask is the difference between two reads over tasks.
func (b serverCounts) perTask(a serverCounts, tasks int) ServerMsgs {
	if tasks <= 0 {
		return ServerMsgs{}
	}
	n := float64(tasks)
	m := ServerMsgs{InMsgs: float64(a.in-b.in) / n, OutMsgs: float64(a.out-b.out) / n,
		InBytes: float64(a.inB-b.inB) / n, OutBytes: float64(a.outB-b.outB) / n, ByRole: map[string]MsgCount{}}
	for r, x := range a.byRole {
		y := b.byRole[r]
		m.ByRole[r] = MsgCount{In: float64(x[0]-y[0]) / n, Out: float64(x[1]-y[1]) / n}
	}
	return m
}

// String is one line: totals, then each role's in/out.
func (m ServerMsgs) String() string {
	roles := make([]string, 0, len(m.ByRole))
	for r := range m.ByRole {
		roles = append(roles, r)
	}
	sort.Strings(roles)
	var b strings.Builder
	fmt.Fprintf(&b, "in %.2f, out %.2f msgs (%.0f / %.0f bytes)", m.InMsgs, m.OutMsgs, m.InBytes, m.OutBytes)
	for _, r := range roles {
		fmt.Fprintf(&b, "; %s %.2f/%.2f", r, m.ByRole[r].In, m.ByRole[r].Out)
	}
	return b.String()
}

func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("nats-server monitor: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("nats-server monitor: %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
