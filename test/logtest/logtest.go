// Package logtest sends what a component logs to the test's log.
package logtest

import (
	"io"
	"strings"
	"sync"
	"testing"
)

// Writer writes each line it is given to t's log after prefix, until the test ends (a component
// still running then would make testing panic).
func Writer(t testing.TB, prefix string) io.Writer {
	w := &writer{t: t, prefix: prefix}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

type writer struct {
	mu     sync.Mutex
	t      testing.TB
	prefix string
	done   bool
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
