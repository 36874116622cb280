package relay

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTxnShardID(t *testing.T) {
	got := txnShardID("7412345678901234567", "public.outbox", 3, 1, 4)
	if want := "outbox-relay/7412345678901234567/public.outbox/gen-3/shard-1-of-4"; got != want {
		t.Fatalf("txnShardID = %s, want %s", got, want)
	}
}

// A cursor record carries every group's position as the cursor table holds it, and the events
// parked and dead-lettered and not yet confirmed, and reads back as written; a record that is not one, of another
// format version, filed under another shard's key or without a position is refused, saying why.
func TestCursorRecordRoundTrip(t *testing.T) {
	shard := txnShardID("1", "public.outbox", 1, 0, 2)
	groups := []*cursorGroup{
		{buckets: []int16{0, 2}, snap: snapMark{text: "10:20:12,15", floor: 100, ceil: -1}, next: snapMark{text: "18:30:", floor: 120, ceil: 180}, last: 150},
		{buckets: []int16{4, 6}, snap: unmarked("20:31:"), next: unmarked("")},
	}
	created := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	rec := cursorRecordOf(shard, groups, []txnRow{{141, created}, {147, created}})
	rec.Dead = []txnDead{{ID: 149, EventID: "0193a0c4-7f1e-7c3a-9d2b-5e8f6a1b2c3d", AggID: "order-7", Error: "dead-lettered to dlq: no topic"}}
	got, err := decodeCursor(shard, rec.encode())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Groups) != 2 || got.Groups[0].Next != "18:30:" || got.Groups[0].NextCeil != 180 || got.Groups[0].Last != 150 ||
		got.Groups[1].Snap != "20:31:" || got.Groups[1].NextFloor != -1 || len(got.Parked) != 2 || got.Parked[1].ID != 147 ||
		!got.Parked[1].Created.Equal(created) || len(got.Dead) != 1 || got.Dead[0] != rec.Dead[0] {
		t.Fatalf("read back %+v, want %+v", got, rec)
	}
	for name, tc := range map[string]struct {
		shard, body, want string
	}{
		"not JSON":        {shard, `{"v":1,`, "is not one"},
		"another version": {shard, `{"v":2,"shard":"` + shard + `","groups":[{"buckets":[0]}]}`, "format version 2"},
		"another shard":   {shard, strings.Replace(string(rec.encode()), "shard-0-of-2", "shard-1-of-2", 1), "names the shard"},
		"no position":     {shard, `{"v":1,"shard":"` + shard + `","groups":[]}`, "has no position"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeCursor(tc.shard, []byte(tc.body)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("decodeCursor: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// reconcileCursor adopts the record's position where it is ahead of the database's (a crash
// between a commit and the database's copy), keeps the database's where they agree or where the
// database is ahead (the shard published at-least-once since), and refuses records that cover
// some buckets of a row and not others.
func TestReconcileCursor(t *testing.T) {
	db := func(snap, next string, last int64) []*cursorGroup {
		return []*cursorGroup{{buckets: []int16{0, 1}, snap: unmarked(snap), next: unmarked(next), last: last}}
	}
	rec := func(snap, next string, last int64) []txnCursor {
		return []txnCursor{{V: 1, Groups: []txnCursorGroup{{Buckets: []int16{0, 1}, Snap: snap, Next: next, Last: last}}}}
	}
	for name, tc := range map[string]struct {
		db    []*cursorGroup
		rec   []txnCursor
		adopt bool
		err   error
	}{
		"no record yet":                            {db("10:20:", "", 0), nil, false, nil},
		"the same position":                        {db("10:20:", "20:25:", 7), rec("10:20:", "20:25:", 7), false, nil},
		"record further within the range":          {db("10:20:", "20:25:", 7), rec("10:20:", "20:25:", 9), true, nil},
		"record past the range":                    {db("10:20:", "20:25:", 7), rec("20:25:", "", 0), true, nil},
		"record in the next range":                 {db("10:20:", "", 0), rec("10:20:", "20:25:", 3), true, nil},
		"record at a later snapshot":               {db("10:20:", "", 0), rec("22:40:23", "", 0), true, nil},
		"database before its first batch":          {db("", "", 0), rec("10:20:", "", 0), true, nil},
		"database ahead (published at-least-once)": {db("30:41:", "", 0), rec("10:20:", "20:25:", 3), false, nil},
		"database further within the range":        {db("10:20:", "20:25:", 9), rec("10:20:", "20:25:", 7), false, nil},
		// Snapshots taken with no transaction id assigned between them share their xmax: the later
		// one lists fewer transactions in progress.
		"record at a later snapshot, the same xmax":   {db("10:20:10,12", "", 0), rec("12:20:12", "", 0), true, nil},
		"record past the range, the same xmax":        {db("10:20:10,12", "12:20:12", 7), rec("12:20:12", "", 0), true, nil},
		"record in a range to the same xmax":          {db("10:20:10,12", "", 0), rec("10:20:10,12", "12:20:12", 3), true, nil},
		"database at a later snapshot, the same xmax": {db("12:20:12", "", 0), rec("10:20:10,12", "12:20:12", 3), false, nil},
		"database past the range, the same xmax":      {db("20:20:", "", 0), rec("12:20:12", "20:20:", 5), false, nil},
		"a record of some of the row's buckets, ahead": {db("10:20:", "", 0),
			[]txnCursor{{V: 1, Groups: []txnCursorGroup{{Buckets: []int16{0, 2}, Snap: "22:40:"}}}}, false, errCursorLayout},
		"a record of some of the row's buckets, not ahead": {db("10:20:", "", 0),
			[]txnCursor{{V: 1, Groups: []txnCursorGroup{{Buckets: []int16{0, 2}, Snap: "10:20:"}}}}, false, nil},
		"a row merged after its parts' record (one position)": {db("10:20:", "", 0),
			[]txnCursor{{V: 1, Groups: []txnCursorGroup{{Buckets: []int16{0}, Snap: "22:40:"}, {Buckets: []int16{1}, Snap: "22:40:"}}}}, true, nil},
		"records of two shards now in one row, ahead at one position": {db("10:20:", "", 0),
			[]txnCursor{{V: 1, Groups: []txnCursorGroup{{Buckets: []int16{0}, Snap: "22:40:"}}}, {V: 1, Groups: []txnCursorGroup{{Buckets: []int16{1}, Snap: "22:40:"}}}}, true, nil},
		"records of two shards now in one row, ahead at two positions": {db("10:20:", "", 0),
			[]txnCursor{{V: 1, Groups: []txnCursorGroup{{Buckets: []int16{0}, Snap: "22:40:"}}}, {V: 1, Groups: []txnCursorGroup{{Buckets: []int16{1}, Snap: "22:41:"}}}}, false, errCursorLayout},
	} {
		t.Run(name, func(t *testing.T) {
			adopt, _, _, err := reconcileCursor(tc.db, tc.rec)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if _, ok := adopt[0]; ok != tc.adopt {
				t.Fatalf("adopt %v, want %v", adopt, tc.adopt)
			}
		})
	}
	for _, tc := range []struct {
		db   []*cursorGroup
		rec  []txnCursor
		want bool
	}{
		{db("30:41:", "", 0), rec("10:20:", "20:25:", 3), true},
		{db("10:20:", "20:25:", 9), rec("10:20:", "20:25:", 7), true},
		{db("10:20:", "20:25:", 7), rec("10:20:", "20:25:", 7), false},
		{db("10:20:", "20:25:", 7), rec("20:25:", "", 0), false},
		{db("12:20:12", "", 0), rec("10:20:10,12", "12:20:12", 3), true},
		{db("10:20:10,12", "12:20:12", 7), rec("12:20:12", "", 0), false},
	} {
		if _, _, dbAhead, err := reconcileCursor(tc.db, tc.rec); err != nil || dbAhead != tc.want {
			t.Errorf("database %+v, record %+v: dbAhead %v (%v), want %v", *tc.db[0], tc.rec[0].Groups[0], dbAhead, err, tc.want)
		}
	}
	if _, _, _, err := reconcileCursor(db("10:20:", "", 0), rec("ten:20:", "", 0)); err == nil {
		t.Fatal("a record with a snapshot that is not one was taken")
	}
}

// After a reshard, the rows of the new layout pair bucket by bucket with the old layout's
// records: a row split from an old shard's row adopts that shard's position; of several records
// of a bucket the furthest counts (an older layout's record stands behind); the records whose
// positions are adopted are reported (their parks follow them).
func TestReconcileCursorAcrossLayouts(t *testing.T) {
	rows := []*cursorGroup{
		{buckets: []int16{0, 2}, snap: unmarked("10:20:")},
		{buckets: []int16{1, 3}, snap: unmarked("10:20:")},
		{buckets: []int16{4}, snap: unmarked("50:60:")},
	}
	recs := []txnCursor{
		{V: 1, Shard: "gen-1", Groups: []txnCursorGroup{{Buckets: []int16{0, 1, 2, 3, 4}, Snap: "15:25:"}}},
		{V: 1, Shard: "gen-2 shard 0", Groups: []txnCursorGroup{{Buckets: []int16{0, 2}, Snap: "30:40:", Next: "40:45:", NextFloor: 7, NextCeil: 9, Last: 8}}},
	}
	adopt, from, dbAhead, err := reconcileCursor(rows, recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(adopt) != 2 || adopt[0].Snap != "30:40:" || adopt[0].Last != 8 || adopt[0].NextCeil != 9 || adopt[1].Snap != "15:25:" {
		t.Fatalf("adopt %+v", adopt)
	}
	if !slices.Equal(from, []int{0, 1}) || !dbAhead {
		t.Fatalf("from %v, dbAhead %v: want [0 1], true (bucket 4 stands past the first layout's record)", from, dbAhead)
	}
}

func TestTxnGeneration(t *testing.T) {
	prefix := txnTablePrefix("74", "public.outbox")
	for id, want := range map[string]int64{
		txnShardID("74", "public.outbox", 3, 1, 4):  3,
		txnShardID("74", "public.outbox", 12, 0, 1): 12,
		txnShardID("75", "public.outbox", 3, 1, 4):  -1,
		txnShardID("74", "public.outbox2", 3, 1, 4): -1,
		prefix + "gen-3/shard-1-of-4/x":             -1,
		prefix + "gen-x":                            -1,
	} {
		gen, ok := txnGeneration(prefix, id)
		if !ok {
			gen = -1
		}
		if gen != want {
			t.Errorf("txnGeneration(%s) = %d, want %d", id, gen, want)
		}
	}
}
