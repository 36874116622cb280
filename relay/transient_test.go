package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// Which publish errors are the cluster's (the relay backs off as a whole, no attempt counted)
// and which are the event's. The no-leader case is the error kafka-go returned in
// TestKafkaOutage right after the broker came back, before its partitions had leaders.
func TestTransient(t *testing.T) {
	noLeader := fmt.Errorf("kafka.(*Client).Produce: %w",
		&protocol.TopicPartitionError{Topic: "t", Partition: 2, Err: protocol.ErrNoLeader})
	tests := map[string]struct {
		err  error
		want bool
	}{
		"nil":                     {nil, false},
		"no leader (wrapped)":     {noLeader, true},
		"leader not available":    {kafka.LeaderNotAvailable, true},
		"unknown topic":           {kafka.UnknownTopicOrPartition, false},
		"invalid message":         {kafka.InvalidMessage, false},
		"message too large":       {kafka.MessageTooLargeError{}, false},
		"connection closed (EOF)": {fmt.Errorf("write: %w", io.EOF), true},
		"deadline":                {context.DeadlineExceeded, true},
		"anything else":           {errors.New("boom"), false},
	}
	for name, tc := range tests {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("%s: transient(%v) = %v, want %v", name, tc.err, got, tc.want)
		}
	}
}
