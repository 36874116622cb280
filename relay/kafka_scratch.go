package relay

import (
	"bytes"
	"io"

	"github.com/segmentio/kafka-go"
)

// The buffers of kafkaPublisher's write calls: a call's groups (one record batch per
// partition), their messages, and the reader that hands a produce request its records.

type topicPartition struct {
	topic     string
	partition int
}

// produceGroup is one produce request of a write call: a partition's messages, and its outcome.
type produceGroup struct {
	topicPartition
	leader  int32           // the partition's leader, by the publisher's metadata
	idx     []int           // the messages' indexes in the call, ascending
	recs    []kafka.Message // copies of those messages, with the call's time
	err     error
	recErrs map[int]error // the broker's errors of single records, by index in recs
}

// writeScratch is the buffers of one write call, reused by later ones.
type writeScratch struct {
	topics map[string]topicResult
	index  map[topicPartition]int
	groups []produceGroup
	recs   []kafka.Message
}

// topicResult is a topic's partitions (and their leaders) for one write call, or why it has none.
type topicResult struct {
	ids     []int
	leaders map[int]int32
	err     error
}

func (s *writeScratch) reset() {
	if s.index == nil {
		s.index = map[topicPartition]int{}
		s.topics = map[string]topicResult{}
	}
	clear(s.index)
	clear(s.topics)
	s.groups = s.groups[:0]
}

// recordReader hands a produce request its records: the messages' keys, values, headers and
// times, without copying them.
type recordReader struct {
	msgs       []kafka.Message
	next       int
	rec        kafka.Record
	key, value bytesReadCloser
}

func (r *recordReader) ReadRecord() (*kafka.Record, error) {
	if r.next >= len(r.msgs) {
		return nil, io.EOF
	}
	m := &r.msgs[r.next]
	r.next++
	r.rec = kafka.Record{Time: m.Time, Headers: m.Headers}
	if m.Key != nil {
		r.key.Reset(m.Key)
		r.rec.Key = &r.key
	}
	if m.Value != nil {
		r.value.Reset(m.Value)
		r.rec.Value = &r.value
	}
	return &r.rec, nil
}

type bytesReadCloser struct{ bytes.Reader }

func (*bytesReadCloser) Close() error { return nil }
