// Package natsembed runs an embedded NATS server with JetStream on a random
// loopback port: the dev mode (`make run`) and the tests' servers. It does not
// import testing, so a program may link it; tests use natstest, built on it.
package natsembed

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs an embedded server with JetStream. StoreDir "" makes a temporary
// one that Shutdown removes.
func Start(storeDir string) (*server.Server, error) {
	tmp := ""
	if storeDir == "" {
		d, err := os.MkdirTemp("", "mlsched-nats-*")
		if err != nil {
			return nil, err
		}
		storeDir, tmp = d, d
	}
	opts := &server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: storeDir,
		NoLog: true, NoSigs: true, MaxPayload: 8 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server not ready in 10s")
	}
	if tmp != "" {
		go func() { s.WaitForShutdown(); os.RemoveAll(tmp) }()
	}
	return s, nil
}
