package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// OutputCheck is what an independent consumer found on a publisher's topic, against the rows
// of its database and the messages the relay's contract says an event becomes: key = aggregate
// id, value = the payload as PostgreSQL renders the jsonb, headers event_id, event_type,
// aggregate_type, aggregate_id and then one per member of the row's headers object.
type OutputCheck struct {
	Rows     int64 `json:"rows"`     // events in the database
	Records  int64 `json:"records"`  // records on the topic
	Missing  int64 `json:"missing"`  // events never received
	Dupes    int64 `json:"dupes"`    // records of an event already received
	Unknown  int64 `json:"unknown"`  // records naming no event of the database
	Reorders int64 `json:"reorders"` // records of an aggregate after a later event of it (same partition)
	Split    int64 `json:"split"`    // aggregates found in more than one partition
	BadKey   int64 `json:"badKey"`   // key is not the aggregate id
	// BadValue counts values that differ from the payload's text; Example shows the first.
	BadValue int64        `json:"badValue"`
	Example  string       `json:"example,omitempty"`
	Headers  []HeaderDiff `json:"headers,omitempty"` // how the headers differ, by kind
}

// HeaderDiff is one kind of header difference and how many records showed it.
type HeaderDiff struct {
	What    string `json:"what"`
	Count   int64  `json:"count"`
	Example string `json:"example,omitempty"`
}

// OK: every event arrived once, in order per aggregate, with the key and value the relay
// produces (header differences are reported apart).
func (c *OutputCheck) OK() bool {
	return c.Missing == 0 && c.Dupes == 0 && c.Unknown == 0 && c.Reorders == 0 && c.Split == 0 && c.BadKey == 0 && c.BadValue == 0
}

func (c *OutputCheck) summary() string {
	s := fmt.Sprintf("%d events, %d records: %d missing, %d duplicates, %d unknown, %d out of order, %d aggregates split over partitions, %d keys and %d values differ",
		c.Rows, c.Records, c.Missing, c.Dupes, c.Unknown, c.Reorders, c.Split, c.BadKey, c.BadValue)
	if len(c.Headers) == 0 {
		return s + "; headers as the relay's"
	}
	var hs []string
	for _, h := range c.Headers {
		hs = append(hs, fmt.Sprintf("%s (%d)", h.What, h.Count))
	}
	return s + "; headers: " + strings.Join(hs, "; ")
}

// wantEvent is an event as the database holds it.
type wantEvent struct {
	id      int64
	aggType string
	aggID   string
	typ     string
	payload uint64 // fnv-64a of payload::text
	headers string // headers::text
	seen    int32
}

func hash64(b []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64()
}

// checkOutput reads every record of topic and checks it against the outbox rows of dbURL.
func (e *env) checkOutput(ctx context.Context, dbURL, topic string) (*OutputCheck, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT id, event_id::text, aggregate_type, aggregate_id, event_type, payload::text, headers::text FROM %s`, e.table.Ident()))
	if err != nil {
		return nil, err
	}
	want := map[string]*wantEvent{}
	for rows.Next() {
		var ev wantEvent
		var eid string
		var payload []byte
		if err := rows.Scan(&ev.id, &eid, &ev.aggType, &ev.aggID, &ev.typ, &payload, &ev.headers); err != nil {
			rows.Close()
			return nil, err
		}
		ev.payload = hash64(payload)
		want[eid] = &ev
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	chk := &OutputCheck{Rows: int64(len(want))}

	ends, err := e.topicEnds(ctx, topic)
	if err != nil {
		return nil, err
	}
	remaining := map[int32]int64{}
	for p, o := range ends {
		if o > 0 {
			remaining[p] = o
		}
	}
	// The transactions' markers too (exactly-once): the last one is the end's offset.
	cl, err := e.newTopicConsumer(topic, kgo.KeepControlRecords())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	diffs := map[string]*HeaderDiff{}
	lastID := map[int32]map[string]int64{}
	partOf := map[string]int32{}
	deadline := time.Now().Add(5 * time.Minute)
	for len(remaining) > 0 {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the topic was not read to its end within 5 minutes (%d partitions left)", len(remaining))
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if end, ok := remaining[r.Partition]; ok && r.Offset+1 >= end {
				delete(remaining, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			chk.Records++
			e.checkRecord(chk, r, want, diffs, lastID, partOf)
		})
	}
	for _, ev := range want {
		if ev.seen == 0 {
			chk.Missing++
		}
	}
	for _, d := range diffs {
		chk.Headers = append(chk.Headers, *d)
	}
	slices.SortFunc(chk.Headers, func(a, b HeaderDiff) int { return strings.Compare(a.What, b.What) })
	return chk, nil
}

func (e *env) checkRecord(chk *OutputCheck, r *kgo.Record, want map[string]*wantEvent, diffs map[string]*HeaderDiff,
	lastID map[int32]map[string]int64, partOf map[string]int32) {
	got := map[string]string{}
	var order []string
	for _, h := range r.Headers {
		if _, dup := got[h.Key]; dup {
			addDiff(diffs, "header "+h.Key+" appears more than once", h.Key)
		}
		got[h.Key] = string(h.Value)
		order = append(order, h.Key)
	}
	eid, ok := got[contract.HeaderEventID]
	if !ok {
		eid = got["id"] // the Outbox Event Router's own header
	}
	ev := want[eid]
	if ev == nil {
		chk.Unknown++
		return
	}
	ev.seen++
	if ev.seen > 1 {
		chk.Dupes++
		return
	}
	if string(r.Key) != ev.aggID {
		chk.BadKey++
	}
	if hash64(r.Value) != ev.payload {
		chk.BadValue++
		if chk.Example == "" {
			chk.Example = firstLine(string(r.Value), 120)
		}
	}
	if p, ok := partOf[ev.aggID]; ok && p != r.Partition {
		chk.Split++
	}
	partOf[ev.aggID] = r.Partition
	if lastID[r.Partition] == nil {
		lastID[r.Partition] = map[string]int64{}
	}
	if prev, ok := lastID[r.Partition][ev.aggID]; ok && ev.id < prev {
		chk.Reorders++
	} else {
		lastID[r.Partition][ev.aggID] = ev.id
	}

	// The headers the relay sets: its four, then the row's headers object, member by member.
	exp := []struct{ k, v string }{
		{contract.HeaderEventID, eid}, {contract.HeaderEventType, ev.typ},
		{contract.HeaderAggregateType, ev.aggType}, {contract.HeaderAggregateID, ev.aggID},
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal([]byte(ev.headers), &members); err == nil {
		keys := make([]string, 0, len(members))
		for k := range members {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := members[k]
			var s string
			if json.Unmarshal(v, &s) == nil {
				exp = append(exp, struct{ k, v string }{k, s})
			} else if string(v) != "null" {
				exp = append(exp, struct{ k, v string }{k, string(v)})
			}
		}
	}
	expected := map[string]bool{}
	for _, x := range exp {
		expected[x.k] = true
		v, ok := got[x.k]
		switch {
		case !ok:
			addDiff(diffs, "no header "+x.k, "")
		case v != x.v:
			addDiff(diffs, "header "+x.k+" differs", fmt.Sprintf("%q, want %q", firstLine(v, 60), firstLine(x.v, 60)))
		}
	}
	for _, k := range order {
		if !expected[k] {
			addDiff(diffs, "extra header "+k, firstLine(got[k], 80))
		}
	}
}

func addDiff(diffs map[string]*HeaderDiff, what, example string) {
	d := diffs[what]
	if d == nil {
		d = &HeaderDiff{What: what, Example: example}
		diffs[what] = d
	}
	d.Count++
}
