package relay

import (
	"fmt"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

// OwnedBuckets returns the buckets that shard index of count owns, in ascending order: the
// buckets b with b % count == index (see docs/architecture.md, "Shards and fencing"). Every
// bucket belongs to exactly one shard of a given count.
func OwnedBuckets(count, index int) ([]int16, error) {
	if count < 1 || count > outboxdb.Buckets {
		return nil, fmt.Errorf("shard count %d out of range: want 1 to %d", count, outboxdb.Buckets)
	}
	if index < 0 || index >= count {
		return nil, fmt.Errorf("shard index %d out of range: want 0 to %d for a shard count of %d", index, count-1, count)
	}
	out := make([]int16, 0, (outboxdb.Buckets+count-1)/count)
	for b := index; b < outboxdb.Buckets; b += count {
		out = append(out, int16(b))
	}
	return out, nil
}

// ShardOf returns the shard that owns bucket for a shard count.
func ShardOf(bucket, count int) int { return bucket % count }
