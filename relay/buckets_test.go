package relay

import (
	"strings"
	"testing"
)

func TestOwnedBuckets(t *testing.T) {
	tests := []struct {
		count, index int
		wantLen      int
		wantFirst    []int16
	}{
		{count: 1, index: 0, wantLen: 256, wantFirst: []int16{0, 1, 2}},
		{count: 2, index: 1, wantLen: 128, wantFirst: []int16{1, 3, 5}},
		{count: 3, index: 0, wantLen: 86, wantFirst: []int16{0, 3, 6}},
		{count: 3, index: 2, wantLen: 85, wantFirst: []int16{2, 5, 8}},
		{count: 4, index: 3, wantLen: 64, wantFirst: []int16{3, 7, 11}},
		{count: 7, index: 6, wantLen: 36, wantFirst: []int16{6, 13, 20}},
		{count: 256, index: 255, wantLen: 1, wantFirst: []int16{255}},
	}
	for _, tc := range tests {
		got, err := OwnedBuckets(tc.count, tc.index)
		if err != nil {
			t.Fatalf("OwnedBuckets(%d, %d): %v", tc.count, tc.index, err)
		}
		if len(got) != tc.wantLen {
			t.Errorf("OwnedBuckets(%d, %d) has %d buckets, want %d", tc.count, tc.index, len(got), tc.wantLen)
		}
		for i, b := range tc.wantFirst {
			if got[i] != b {
				t.Errorf("OwnedBuckets(%d, %d)[%d] = %d, want %d", tc.count, tc.index, i, got[i], b)
			}
		}
		for i, b := range got {
			if i > 0 && got[i-1] >= b {
				t.Fatalf("OwnedBuckets(%d, %d) not ascending at %d", tc.count, tc.index, i)
			}
			if ShardOf(int(b), tc.count) != tc.index {
				t.Fatalf("bucket %d owned by shard %d of %d, ShardOf says %d", b, tc.index, tc.count, ShardOf(int(b), tc.count))
			}
		}
	}
}

// Every bucket belongs to exactly one shard, whatever the shard count.
func TestBucketsPartition(t *testing.T) {
	for count := 1; count <= 256; count++ {
		owner := make([]int, 256)
		for i := range owner {
			owner[i] = -1
		}
		for index := range count {
			bs, err := OwnedBuckets(count, index)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range bs {
				if owner[b] != -1 {
					t.Fatalf("count %d: bucket %d owned by shards %d and %d", count, b, owner[b], index)
				}
				owner[b] = index
			}
		}
		for b, o := range owner {
			if o == -1 {
				t.Fatalf("count %d: bucket %d has no shard", count, b)
			}
		}
	}
}

func TestOwnedBucketsErrors(t *testing.T) {
	tests := []struct {
		count, index int
		want         string
	}{
		{0, 0, "shard count 0 out of range: want 1 to 256"},
		{257, 0, "shard count 257 out of range"},
		{4, 4, "shard index 4 out of range: want 0 to 3"},
		{4, -1, "shard index -1 out of range"},
	}
	for _, tc := range tests {
		_, err := OwnedBuckets(tc.count, tc.index)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("OwnedBuckets(%d, %d) error %v, want %q", tc.count, tc.index, err, tc.want)
		}
	}
}

// TestFetchBucketsTurn: a shard's fetch reads its buckets starting one further along each time,
// so every bucket is read first once in every len(buckets) fetches, and every fetch reads each
// bucket once.
func TestFetchBucketsTurn(t *testing.T) {
	for _, tc := range []struct{ count, index int }{{1, 0}, {2, 1}, {8, 3}, {256, 255}} {
		buckets, err := OwnedBuckets(tc.count, tc.index)
		if err != nil {
			t.Fatal(err)
		}
		ten := &tenure{buckets: buckets}
		firsts := map[int16]int{}
		for range 3 * len(buckets) {
			got := ten.fetchBuckets()
			if len(got) != len(buckets) {
				t.Fatalf("%d/%d: a fetch reads %d buckets, want %d", tc.index, tc.count, len(got), len(buckets))
			}
			seen := map[int16]bool{}
			for _, b := range got {
				if seen[b] || ShardOf(int(b), tc.count) != tc.index {
					t.Fatalf("%d/%d: fetch order %v repeats a bucket or reads another shard's", tc.index, tc.count, got)
				}
				seen[b] = true
			}
			firsts[got[0]]++
		}
		for _, b := range buckets {
			if firsts[b] != 3 {
				t.Errorf("%d/%d: bucket %d read first %d times in %d fetches, want 3", tc.index, tc.count, b, firsts[b], 3*len(buckets))
			}
		}
	}
}
