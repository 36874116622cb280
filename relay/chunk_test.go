package relay

import "testing"

// TestChunkEnd: a write call carries as many messages as fit its byte budget, at least one, in
// order; the batches and the replays are cut the same way.
func TestChunkEnd(t *testing.T) {
	tests := map[string]struct {
		sizes []int
		start int
		want  int
	}{
		"all fit":                 {sizes: []int{10, 20, 30}, want: 3},
		"exactly the budget":      {sizes: []int{50, 50, 1}, want: 2},
		"one over the budget":     {sizes: []int{60, 41}, want: 1},
		"one message too large":   {sizes: []int{500, 10}, want: 1},
		"from the middle":         {sizes: []int{90, 30, 30, 50}, start: 1, want: 3},
		"the last message":        {sizes: []int{90, 30}, start: 1, want: 2},
		"nothing left":            {sizes: []int{90}, start: 1, want: 1},
		"too large in the middle": {sizes: []int{10, 200, 10}, start: 1, want: 2},
	}
	for name, tc := range tests {
		if got := chunkEnd(tc.sizes, tc.start, 100); got != tc.want {
			t.Errorf("%s: chunkEnd(%v, %d) = %d, want %d", name, tc.sizes, tc.start, got, tc.want)
		}
	}
}
