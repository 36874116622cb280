package outboxdb

import "testing"

func TestBacklogPending(t *testing.T) {
	id := func(v int64) *int64 { return &v }
	for name, c := range map[string]struct {
		b    Backlog
		want int64
	}{
		"nothing unsent":        {Backlog{Limit: 100}, 0},
		"below the limit":       {Backlog{Counted: 42, FirstID: id(1), LastCountedID: id(60), LastID: id(60), Limit: 100}, 42},
		"at the limit, no more": {Backlog{Counted: 100, FirstID: id(1), LastCountedID: id(100), LastID: id(100), Limit: 100}, 100},
		// 100 rows counted over ids 1..100, unsent ids reach 1000: 1000 at the same density.
		"dense ids": {Backlog{Counted: 100, FirstID: id(1), LastCountedID: id(100), LastID: id(1000), Limit: 100}, 1000},
		// Half of the counted id range is gaps (rolled back or already sent): half as many.
		"sparse ids": {Backlog{Counted: 100, FirstID: id(1), LastCountedID: id(200), LastID: id(1000), Limit: 100}, 500},
		// Never fewer than were counted.
		"one id": {Backlog{Counted: 100, FirstID: id(5), LastCountedID: id(5), LastID: id(9), Limit: 100}, 100},
		"no ids": {Backlog{Counted: 100, Limit: 100}, 100},
	} {
		if got := c.b.Pending(); got != c.want {
			t.Errorf("%s: Pending() = %d, want %d", name, got, c.want)
		}
	}
}
