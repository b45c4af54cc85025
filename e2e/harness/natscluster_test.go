package harness_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mlsched/mlsched/e2e/harness"
)

// A proxy forwards bytes both ways, Cut closes its connections and refuses
// new ones, Heal lets them through again.
func TestProxyCutAndHeal(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p, err := harness.StartProxy("echo", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	echo := func() error {
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if string(buf) != "ping\n" {
			return fmt.Errorf("echo %q", buf)
		}
		return nil
	}
	if err := echo(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	live, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	harness.Eventually(t, 10*time.Second, "the proxy tracks the live connection", func() error {
		if p.Conns() == 0 {
			return fmt.Errorf("no connection tracked")
		}
		return nil
	})
	p.Cut()
	_ = live.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := live.Read(make([]byte, 1)); err == nil {
		t.Fatal("a live connection survived Cut")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a live connection was not closed by Cut")
	}
	if err := echo(); err == nil {
		t.Fatal("a new connection went through a cut proxy")
	}
	if p.Refused() == 0 {
		t.Fatal("the cut proxy counted no refused connection")
	}
	p.Heal()
	if err := echo(); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
}

// A 3-node cluster serves an R3 stream; with one node partitioned off the
// other two keep accepting writes, the partitioned node refuses clients, and
// after Heal it catches up: every replica current with every message.
//
// While partitioned the node must have no route at all, and its peers none
// to it: this once failed one run in five because routes learnt by gossip
// went around the cut proxies (see NATSCluster), and then the leader never
// saw the partitioned replica behind.
func TestNATSClusterPartition(t *testing.T) {
	t.Parallel()
	c := harness.New(t)
	nc := c.StartNATSCluster(harness.NATSClusterOptions{})
	if len(nc.Nodes) != 3 || strings.Count(nc.URL, ",") != 2 {
		t.Fatalf("cluster: %d nodes, URL %q", len(nc.Nodes), nc.URL)
	}
	_, js := c.Conn()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var s jetstream.Stream
	harness.Eventually(t, time.Minute, "R3 stream created", func() error {
		var err error
		s, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"},
			Storage: jetstream.FileStorage, Replicas: 3})
		return err
	})
	publish := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			id := fmt.Sprintf("m-%d", i)
			harness.Eventually(t, time.Minute, "publish "+id, func() error {
				pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
				defer pcancel()
				_, err := js.Publish(pctx, "t.x", []byte(id), jetstream.WithMsgID(id))
				return err
			})
		}
	}
	publish(0, 20)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream cluster info %+v: want a leader and 2 replicas", info.Cluster)
	}

	if err := nc.Partition(0); err != nil {
		t.Fatal(err)
	}
	if cl, err := nats.Connect(nc.Nodes[0].URL, nats.Timeout(time.Second), nats.MaxReconnects(0)); err == nil {
		cl.Close()
		t.Fatal("a client connected to the partitioned node")
	}
	if err := nc.WaitIsolated(0, time.Minute); err != nil {
		t.Fatal(err)
	}
	cutName := nc.Nodes[0].ServerName
	publish(20, 40) // two of three: still a quorum
	harness.Eventually(t, time.Minute, "the partitioned replica is seen behind", func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		for _, r := range info.Cluster.Replicas {
			if r.Name == nc.Nodes[0].ServerName && (r.Offline || !r.Current) {
				return nil
			}
		}
		if info.Cluster.Leader == cutName {
			return fmt.Errorf("the partitioned node still leads")
		}
		if err := nc.Isolated(ctx, 0); err != nil {
			return fmt.Errorf("replicas %+v: %w", info.Cluster.Replicas, err)
		}
		return fmt.Errorf("replicas %+v", info.Cluster.Replicas)
	})

	nc.Heal(0)
	if err := nc.WaitHealthy(time.Minute); err != nil {
		t.Fatalf("after heal: %v", err)
	}
	harness.Eventually(t, time.Minute, "every replica current with 40 messages", func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 40 {
			return fmt.Errorf("%d messages", info.State.Msgs)
		}
		if len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("replicas %+v", info.Cluster.Replicas)
		}
		for _, r := range info.Cluster.Replicas {
			if r.Offline || !r.Current {
				return fmt.Errorf("replica %s offline=%v current=%v", r.Name, r.Offline, r.Current)
			}
		}
		return nil
	})
}
