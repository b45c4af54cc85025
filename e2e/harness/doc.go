// Package harness runs mlsched as real processes for end-to-end tests:
// nats-server (file storage, sync_interval always), redis-server,
// dispatchers and workers, each on free loopback ports with its own
// directory and log file. StartNATSCluster runs three nats-server processes
// as one cluster (R3 streams) with every client and route link through a
// loopback TCP Proxy, so that a test can partition one server and heal it.
//
// Binaries are built once per test binary (or taken from MLSCHED_E2E_BIN),
// readiness is awaited by condition with a deadline, logs are printed when a
// test fails, and every process is killed in t.Cleanup. A test package that
// uses the harness calls Main from its TestMain so that the build directory
// is removed at exit.
package harness
