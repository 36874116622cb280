package plugin

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-operator/outbox-operator/plugin/replaycli"
)

// TestReplayCommand runs replay against a row-tracked table (a relay runs a replay in
// TestThroughKafka): the dry run records nothing, a start past retention and bad input are
// refused, a request is recorded with jane's name and shows in status and --list until cancelled.
func TestReplayCommand(t *testing.T) {
	f := newFixture(t, nil)
	f.writeEvents(t, 3, "a", "b")
	f.exec(t, `UPDATE outbox SET sent_at = now()`)
	a1, _ := f.idOf(t, "a", 1)
	_, a3 := f.idOf(t, "a", 3)

	var res replaycli.Result
	f.runJSON(t, &res, "replay", "orders", "--from", fmt.Sprint(a1), "--dry-run")
	if !res.DryRun || res.ID != 0 || res.Events != 6 || res.FromID != a1 || len(res.Topics) != 1 ||
		res.Topics[0] != (replaycli.TopicCount{AggregateType: "order", Topic: "orders", Events: 6}) {
		t.Errorf("replay --dry-run: %+v", res)
	}
	out, errOut, code := f.run(t, "replay", "orders", "--from", "1h", "--aggregate", "b", "--dry-run")
	t.Logf("kubectl outbox replay orders --from 1h --aggregate b --dry-run:\n%s", out)
	if code != 0 || !strings.Contains(out, "Dry run, nothing recorded: the replay would publish 3 events again") || !strings.Contains(out, "order           orders  3") {
		t.Errorf("replay --dry-run table: exit %d, %s%s", code, out, errOut)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "orders"}, "replay needs --from"},
		{[]string{"replay", "orders", "--rate", "5"}, "replay needs --from"},
		{[]string{"replay", "orders", "--from", "1h", "--list"}, "exclude each other"},
		{[]string{"replay", "orders", "--open"}, "--open goes with --list"},
		{[]string{"replay", "orders", "--cancel", "0"}, "a replay id is a positive number"},
		{[]string{"replay", "orders", "--from", "yesterday"}, "want a time (RFC 3339"},
		{[]string{"replay", "orders", "--from", "72h"}, "past retention"},
		{[]string{"replay", "orders", "--from", "72h", "--dry-run"}, fmt.Sprintf("the oldest retained event is id %d", a1)},
		{[]string{"replay", "orders", "--from", "1h", "--topic", "no topic"}, "not a valid Kafka topic name"},
		{[]string{"replay", "orders", "--cancel", "999"}, "no replay 999"},
	} {
		_, errOut, code := f.run(t, c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("kubectl outbox %s: exit %d, %q; want an error containing %q", strings.Join(c.args, " "), code, errOut, c.want)
		}
	}
	_, errOut, _ = f.run(t, "replay", "orders", "--from", "72h", "--dry-run")
	t.Logf("kubectl outbox replay orders --from 72h --dry-run:\n%s", errOut)
	var n int
	if err := f.db.QueryRow(`SELECT count(*) FROM outbox_replays`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the dry runs and bad input recorded %d replays (%v)", n, err)
	}

	// A request: recorded with who, shown by status and --list.
	f.runJSON(t, &res, "replay", "orders", "--from", fmt.Sprint(a1), "--to", a3, "--aggregate", "a", "--rate", "50", "--reason", "billing lost its state")
	if res.DryRun || res.ID == 0 || res.Events != 3 {
		t.Fatalf("replay: %+v", res)
	}
	var who, reason string
	if err := f.db.QueryRow(`SELECT requested_by, reason FROM outbox_replays WHERE id = $1`, res.ID).Scan(&who, &reason); err != nil ||
		who != testUser || reason != "billing lost its state" {
		t.Errorf("recorded replay: requested by %q, reason %q (%v)", who, reason, err)
	}
	var s Status
	f.runJSON(t, &s, "status", "orders")
	var rp ReplayInProgress
	if b, err := json.Marshal(s.Replay); err != nil || json.Unmarshal(b, &rp) != nil {
		t.Fatalf("status .replay: %v", s.Replay)
	}
	if rp.ID != res.ID || rp.State != "pending" || rp.Total != 3 || rp.Replayed != 0 || rp.Rate != 50 || rp.RequestedBy != testUser || rp.Open != 1 {
		t.Errorf("status .replay: %+v", rp)
	}
	out, _, _ = f.run(t, "status", "orders")
	if want := fmt.Sprintf("%d pending: 0/3 events (0%%), at most 50 events/s, requested by jane at ", res.ID); !strings.Contains(out, "Replay:") || !strings.Contains(out, want) {
		t.Errorf("status table lacks %q:\n%s", want, out)
	}
	var list []replaycli.ReplayOutput
	f.runJSON(t, &list, "replay", "orders", "--list", "--open")
	if len(list) != 1 || list[0].ID != res.ID || list[0].AggregateID != "a" || list[0].RequestedBy != testUser || list[0].State != "pending" {
		t.Errorf("replay --list --open: %+v", list)
	}
	out, _, _ = f.run(t, "replay", "orders", "--list")
	t.Logf("kubectl outbox replay orders --list:\n%s", out)

	// Cancelled: gone from status and --open, listed as cancelled; a second cancel is refused.
	out, errOut, code = f.run(t, "replay", "orders", "--cancel", fmt.Sprint(res.ID))
	if code != 0 || !strings.Contains(out, fmt.Sprintf("Replay %d cancelled", res.ID)) {
		t.Errorf("replay --cancel: exit %d, %s%s", code, out, errOut)
	}
	var after Status
	f.runJSON(t, &after, "status", "orders")
	if after.Replay != nil {
		t.Errorf("status .replay after the cancel: %v", s.Replay)
	}
	f.runJSON(t, &list, "replay", "orders", "--list", "--open")
	if len(list) != 0 {
		t.Errorf("replay --list --open after the cancel: %+v", list)
	}
	f.runJSON(t, &list, "replay", "orders", "--list")
	if len(list) != 1 || list[0].State != "cancelled" {
		t.Errorf("replay --list after the cancel: %+v", list)
	}
	if _, errOut, code := f.run(t, "replay", "orders", "--cancel", fmt.Sprint(res.ID)); code == 0 || !strings.Contains(errOut, "is cancelled already") {
		t.Errorf("second cancel: exit %d, %s", code, errOut)
	}
}
