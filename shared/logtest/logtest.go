// Package logtest has what tests need to read a process's log while its
// goroutines still write it.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a log sink safe for concurrent writers and readers: give it to
// zerolog.New (or any io.Writer) and read it with String or Lines while the
// code under test keeps logging.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines are the lines written so far (none when nothing was).
func (s *Buffer) Lines() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := bytes.TrimSpace(s.b.Bytes())
	if len(t) == 0 {
		return nil
	}
	return bytes.Split(append([]byte(nil), t...), []byte("\n"))
}
