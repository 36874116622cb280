package relay

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
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
		"nil":                 {nil, false},
		"no leader (wrapped)": {noLeader, true},
		"topic not in the client's metadata": {fmt.Errorf("kafka.(*Client).Produce: %w",
			&protocol.TopicError{Topic: "t", Err: protocol.ErrNoTopic}), true},
		"partition not in the client's metadata": {fmt.Errorf("kafka.(*Client).Produce: %w",
			&protocol.TopicPartitionError{Topic: "t", Partition: 7, Err: protocol.ErrNoPartition}), true},
		"not leader (the broker's)": {fmt.Errorf("%w: leader moved", kafka.NotLeaderForPartition), true},
		"leader not available":      {kafka.LeaderNotAvailable, true},
		"unknown topic":             {kafka.UnknownTopicOrPartition, false}, // refused, below
		"invalid message":           {kafka.InvalidMessage, false},
		"message too large":         {kafka.MessageTooLargeError{}, false},
		"connection closed (EOF)":   {fmt.Errorf("write: %w", io.EOF), true},
		"deadline":                  {context.DeadlineExceeded, true},
		"anything else":             {errors.New("boom"), false},
	}
	for name, tc := range tests {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("%s: transient(%v) = %v, want %v", name, tc.err, got, tc.want)
		}
	}
}

// Which publish errors are the cluster refusing the relay (credentials, ACLs, TLS, a missing
// topic): never charged to an event, an outage of the relay when nothing gets through.
func TestRefused(t *testing.T) {
	wrapped := func(err error) error { return fmt.Errorf("kafka.(*Writer).WriteMessages: %w", err) }
	tests := map[string]struct {
		err  error
		want bool
	}{
		"nil":                          {nil, false},
		"SASL authentication failed":   {wrapped(kafka.SASLAuthenticationFailed), true},
		"unsupported SASL mechanism":   {kafka.UnsupportedSASLMechanism, true},
		"topic authorization failed":   {wrapped(kafka.TopicAuthorizationFailed), true},
		"cluster authorization":        {kafka.ClusterAuthorizationFailed, true},
		"unknown topic":                {wrapped(kafka.UnknownTopicOrPartition), true},
		"unknown CA":                   {wrapped(x509.UnknownAuthorityError{}), true},
		"certificate for another host": {x509.HostnameError{Host: "kafka"}, true},
		"TLS against plaintext":        {wrapped(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), true},
		"client certificate refused":   {&net.OpError{Op: "remote error", Err: errors.New("remote error: tls: bad certificate")}, true},
		"message too large":            {kafka.MessageTooLargeError{}, false},
		"invalid message":              {kafka.InvalidMessage, false},
		"leader not available":         {kafka.LeaderNotAvailable, false},
		"connection refused":           {wrapped(syscall.ECONNREFUSED), false},
	}
	for name, tc := range tests {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("%s: refused(%v) = %v, want %v", name, tc.err, got, tc.want)
		}
		if refused(tc.err) && transient(tc.err) {
			t.Errorf("%s: both refused and transient", name)
		}
	}
}
