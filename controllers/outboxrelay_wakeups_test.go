package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/outbox-operator/outbox-operator/migrations"
)

// ensureWakeups matches the table's insert trigger to spec.publish.notify, as the database shows
// it, and records each change once.
func TestEnsureWakeups(t *testing.T) {
	e := newStepEnv(t, time.Now())
	ctx := context.Background()
	notifies := func() bool {
		t.Helper()
		on, err := migrations.Notifies(ctx, e.db, e.s.table)
		if err != nil {
			t.Fatal(err)
		}
		return on
	}
	for i, c := range []struct {
		notify *bool
		want   bool
		event  string // the event recorded, "" for none
	}{
		{nil, true, ""}, // the default on a new table: the trigger is there already
		{ptr.To(false), false, "dropped the insert trigger"},
		{ptr.To(false), false, ""},
		{ptr.To(true), true, "created the insert trigger"},
		{nil, true, ""},
	} {
		e.s.relay.Spec.Publish.Notify = c.notify
		res, err := e.r.ensureWakeups(ctx, e.s)
		if err != nil || res.RequeueAfter != 0 {
			t.Fatalf("step %d: %v, requeue after %s", i, err, res.RequeueAfter)
		}
		if got := notifies(); got != c.want {
			t.Fatalf("step %d (notify %v): the table notifies %v, want %v", i, c.notify, got, c.want)
		}
		evs := drain(e.rec)
		switch {
		case c.event == "" && len(evs) > 0:
			t.Errorf("step %d: events %q, want none", i, evs)
		case c.event != "" && (len(evs) != 1 || !strings.Contains(evs[0], c.event)):
			t.Errorf("step %d: events %q, want one saying %q", i, evs, c.event)
		}
	}
}
