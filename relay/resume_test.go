package relay

import (
	"slices"
	"testing"
	"time"
)

// TestResumeAfterFetch: how a fetch moves the position (row_resume.go): the rows read below the
// floors come first and are put in id order; the buckets read to their end move their floor to
// the sequence's value; the bucket where the batch filled up to its last row; the ones after it
// keep theirs; rows below the floors alone filling the batch drop it and start over.
func TestResumeAfterFetch(t *testing.T) {
	type r struct {
		id     int64
		bucket int16
	}
	const snap = "100:105:101,103"
	for name, tc := range map[string]struct {
		sharded    bool
		floors     map[int16]int64
		order      []int16
		rows       []r
		n          int
		seq        int64
		wantOK     bool
		wantFloors map[int16]int64
		wantIDs    []int64 // the batch's rows afterwards
		wantWatch  bool
	}{
		"unsharded, read to the end": {
			floors: map[int16]int64{0: 10}, rows: []r{{11, 0}, {12, 0}}, n: 5, seq: 20,
			wantOK: true, wantFloors: map[int16]int64{0: 20}, wantIDs: []int64{11, 12}, wantWatch: true,
		},
		"unsharded, rows committed after the sequence was read": {
			floors: map[int16]int64{0: 10}, rows: []r{{11, 0}, {25, 0}}, n: 5, seq: 20,
			wantOK: true, wantFloors: map[int16]int64{0: 25}, wantIDs: []int64{11, 25}, wantWatch: true,
		},
		"unsharded, batch full": {
			floors: map[int16]int64{0: 10}, rows: []r{{11, 0}, {12, 0}, {13, 0}}, n: 3, seq: 90,
			wantOK: true, wantFloors: map[int16]int64{0: 13}, wantIDs: []int64{11, 12, 13}, wantWatch: true,
		},
		"unsharded, rows below the floor first, sorted": {
			floors: map[int16]int64{0: 10}, rows: []r{{9, 0}, {4, 0}, {7, 0}, {11, 0}}, n: 5, seq: 30,
			wantOK: true, wantFloors: map[int16]int64{0: 30}, wantIDs: []int64{4, 7, 9, 11}, wantWatch: true,
		},
		"unsharded, rows below the floor fill the batch": {
			floors: map[int16]int64{0: 10}, rows: []r{{9, 0}, {4, 0}, {7, 0}}, n: 3, seq: 30,
			wantOK: false, wantFloors: map[int16]int64{0: 0}, wantIDs: []int64{9, 4, 7}, wantWatch: false,
		},
		"unsharded, nothing": {
			floors: map[int16]int64{0: 10}, n: 3, seq: 30,
			wantOK: true, wantFloors: map[int16]int64{0: 30}, wantWatch: true,
		},
		"sharded, filled in the second bucket": {
			sharded: true, floors: map[int16]int64{3: 5, 7: 6, 11: 7}, order: []int16{3, 7, 11},
			rows: []r{{2, 7}, {8, 3}, {9, 7}, {12, 7}}, n: 4, seq: 50,
			wantOK: true, wantFloors: map[int16]int64{3: 50, 7: 12, 11: 7}, wantIDs: []int64{2, 8, 9, 12}, wantWatch: true,
		},
		"sharded, filled at the end of a bucket": {
			sharded: true, floors: map[int16]int64{3: 5, 7: 6}, order: []int16{7, 3},
			rows: []r{{9, 7}, {10, 7}}, n: 2, seq: 50,
			wantOK: true, wantFloors: map[int16]int64{7: 10, 3: 5}, wantIDs: []int64{9, 10}, wantWatch: true,
		},
		"sharded, every bucket read": {
			sharded: true, floors: map[int16]int64{3: 5, 7: 60}, order: []int16{3, 7},
			rows: []r{{8, 3}}, n: 4, seq: 50,
			wantOK: true, wantFloors: map[int16]int64{3: 50, 7: 60}, wantIDs: []int64{8}, wantWatch: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := &resume{sharded: tc.sharded, snap: snap, seq: tc.seq}
			for b, f := range tc.floors {
				s.floors[b] = f
			}
			b := &batch{}
			for _, x := range tc.rows {
				b.rows = append(b.rows, row{id: x.id, bucket: x.bucket})
			}
			if ok := s.afterFetch(b, tc.order, tc.n); ok != tc.wantOK {
				t.Fatalf("afterFetch = %v, want %v", ok, tc.wantOK)
			}
			for bk, want := range tc.wantFloors {
				if s.floors[bk] != want {
					t.Errorf("floor of bucket %d: %d, want %d", bk, s.floors[bk], want)
				}
			}
			var ids []int64
			for _, x := range b.rows {
				ids = append(ids, x.id)
			}
			if !slices.Equal(ids, tc.wantIDs) {
				t.Errorf("rows %v, want %v", ids, tc.wantIDs)
			}
			if got := s.xmax != nil; got != tc.wantWatch {
				t.Fatalf("watch set: %v, want %v", got, tc.wantWatch)
			}
			if tc.wantWatch && (*s.xmax != "105" || !slices.Equal(s.xip, []string{"101", "103"})) {
				t.Errorf("watch %s %v, want 105 [101 103]", *s.xmax, s.xip)
			}
		})
	}
}

// TestResumeBeforeFetch: an aggregate leaving the blocked set, and the time since the last read
// from the oldest unsent row, start the next fetch over; an aggregate joining it does not.
func TestResumeBeforeFetch(t *testing.T) {
	t0 := time.Now()
	s := &resume{}
	s.beforeFetch(t0, nil)
	if !s.fullAt.Equal(t0) {
		t.Fatalf("the first fetch reads from the oldest unsent row")
	}
	advance := func() {
		s.floors[0], s.snap, s.seq = 0, "1:2:", 40
		if !s.afterFetch(&batch{}, nil, 10) || s.floors[0] != 40 {
			t.Fatalf("not advanced: %d", s.floors[0])
		}
	}
	advance()
	s.beforeFetch(t0.Add(time.Second), []string{"a", "b"})
	if s.floors[0] != 40 {
		t.Fatalf("a new blocked aggregate reset the position")
	}
	s.beforeFetch(t0.Add(2*time.Second), []string{"b"})
	if s.floors[0] != 0 || s.xmax != nil {
		t.Fatalf("an aggregate left the blocked set, and the position stayed: %d", s.floors[0])
	}
	advance()
	s.beforeFetch(t0.Add(3*time.Second), []string{"b"})
	if s.floors[0] != 40 {
		t.Fatalf("the same blocked set reset the position")
	}
	s.beforeFetch(t0.Add(3*time.Second+resumeFullEvery), []string{"b"})
	if s.floors[0] != 0 {
		t.Fatalf("no read from the oldest unsent row for %s", resumeFullEvery)
	}
}
