package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// hack/debezium.sh writes the configuration the report documents: the router mapped to the
// outbox's columns, the relay's topic map, the password only in a file its owner reads, and
// nothing secret on stdout. No Java needed: config starts nothing.
func TestDebeziumConfig(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	t.Chdir("../..")
	dir := t.TempDir()
	vars := append(os.Environ(), "DEBEZIUM_PG_PASSWORD=s3cret-pw", "DEBEZIUM_PG_DB=shop", "DEBEZIUM_PG_PORT=6543",
		"DEBEZIUM_TOPIC_MAP=order=orders.v1,pay.ment=payments", "DEBEZIUM_BOOTSTRAP=127.0.0.1:9",
		"DEBEZIUM_TABLE=app.outbox")
	out, err := runScript(vars, "config", dir)
	if err != nil {
		t.Fatalf("config: %v: %s", err, out)
	}
	if strings.Contains(out, "s3cret") {
		t.Fatalf("the password was printed: %q", out)
	}
	props := func(name string) map[string]string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
				m[k] = v
			}
		}
		return m
	}
	c, w := props("connector.properties"), props("worker.properties")
	for k, want := range map[string]string{
		"database.password":                           "s3cret-pw",
		"database.dbname":                             "shop",
		"database.port":                               "6543",
		"table.include.list":                          "app.outbox",
		"plugin.name":                                 "pgoutput",
		"snapshot.mode":                               "no_data",
		"publication.autocreate.mode":                 "disabled",
		"transforms":                                  "outbox,topic1,topic2",
		"transforms.outbox.type":                      "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.table.field.event.id":      "event_id",
		"transforms.outbox.table.field.event.key":     "aggregate_id",
		"transforms.outbox.table.field.event.payload": "payload",
		"transforms.outbox.route.by.field":            "aggregate_type",
		"transforms.topic1.regex":                     "order",
		"transforms.topic1.replacement":               "orders.v1",
		"transforms.topic2.regex":                     `pay\.ment`,
		"transforms.topic2.replacement":               "payments",
	} {
		if c[k] != want {
			t.Errorf("connector %s = %q, want %q", k, c[k], want)
		}
	}
	for k, want := range map[string]string{
		"bootstrap.servers":           "127.0.0.1:9",
		"plugin.discovery":            "service_load",
		"key.converter":               "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":             "org.apache.kafka.connect.storage.StringConverter",
		"producer.acks":               "all",
		"producer.enable.idempotence": "true",
	} {
		if w[k] != want {
			t.Errorf("worker %s = %q, want %q", k, w[k], want)
		}
	}
	if !strings.Contains(c["transforms.outbox.table.fields.additional.placement"], "headers:header:headers") {
		t.Errorf("the row's headers are not placed: %q", c["transforms.outbox.table.fields.additional.placement"])
	}
	st, err := os.Stat(filepath.Join(dir, "connector.properties"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		t.Errorf("connector.properties (with the password) has mode %v", st.Mode().Perm())
	}

	// What the report shows has the password redacted.
	e := &env{tmp: t.TempDir()}
	var d DebeziumResult
	t.Setenv("DEBEZIUM_PG_PASSWORD", "s3cret-pw")
	if err := e.debeziumConfig(&d); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.Conn, "s3cret") || !strings.Contains(d.Conn, "database.password=<redacted>") || d.JVM == "" {
		t.Fatalf("reported configuration:\n%s\nJVM %q", d.Conn, d.JVM)
	}
}

// The output check tells the relay's messages from the router's: same key and value, but the
// event id also as `id` and the row's headers as one JSON header.
func TestCheckRecord(t *testing.T) {
	want := func() map[string]*wantEvent {
		return map[string]*wantEvent{
			"e1": {id: 1, aggType: "order", aggID: "order-1", typ: "OrderPlaced", payload: hash64([]byte(`{"a": 1}`)), headers: `{"traceparent": "00-x-01"}`},
			"e2": {id: 2, aggType: "order", aggID: "order-1", typ: "OrderPaid", payload: hash64([]byte(`{"b": 2}`)), headers: `{}`},
		}
	}
	hdr := func(kv ...string) []kgo.RecordHeader {
		var out []kgo.RecordHeader
		for i := 0; i < len(kv); i += 2 {
			out = append(out, kgo.RecordHeader{Key: kv[i], Value: []byte(kv[i+1])})
		}
		return out
	}
	relay := []*kgo.Record{
		{Key: []byte("order-1"), Value: []byte(`{"a": 1}`), Partition: 0,
			Headers: hdr("event_id", "e1", "event_type", "OrderPlaced", "aggregate_type", "order", "aggregate_id", "order-1", "traceparent", "00-x-01")},
		{Key: []byte("order-1"), Value: []byte(`{"b": 2}`), Partition: 0,
			Headers: hdr("event_id", "e2", "event_type", "OrderPaid", "aggregate_type", "order", "aggregate_id", "order-1")},
	}
	run := func(recs []*kgo.Record) *OutputCheck {
		e := &env{}
		w := want()
		chk := &OutputCheck{Rows: int64(len(w))}
		diffs := map[string]*HeaderDiff{}
		last, part := map[int32]map[string]int64{}, map[string]int32{}
		for _, r := range recs {
			chk.Records++
			e.checkRecord(chk, r, w, diffs, last, part)
		}
		for _, ev := range w {
			if ev.seen == 0 {
				chk.Missing++
			}
		}
		for _, d := range diffs {
			chk.Headers = append(chk.Headers, *d)
		}
		slices.SortFunc(chk.Headers, func(a, b HeaderDiff) int { return strings.Compare(a.What, b.What) })
		return chk
	}
	if chk := run(relay); !chk.OK() || len(chk.Headers) != 0 {
		t.Fatalf("relay output: %s", chk.summary())
	}
	router := []*kgo.Record{
		{Key: []byte("order-1"), Value: []byte(`{"a": 1}`), Partition: 0,
			Headers: hdr("id", "e1", "event_id", "e1", "event_type", "OrderPlaced", "aggregate_type", "order", "aggregate_id", "order-1", "headers", `{"traceparent": "00-x-01"}`)},
		{Key: []byte("order-1"), Value: []byte(`{"b": 2}`), Partition: 0,
			Headers: hdr("id", "e2", "event_id", "e2", "event_type", "OrderPaid", "aggregate_type", "order", "aggregate_id", "order-1", "headers", `{}`)},
	}
	chk := run(router)
	var kinds []string
	for _, h := range chk.Headers {
		kinds = append(kinds, h.What)
	}
	if !chk.OK() || !slices.Equal(kinds, []string{"extra header headers", "extra header id", "no header traceparent"}) {
		t.Fatalf("router output: %s (%q)", chk.summary(), kinds)
	}
	// Out of order, duplicated, missing and wrong key.
	bad := []*kgo.Record{relay[1], relay[0], relay[0]}
	bad[1] = &kgo.Record{Key: []byte("order-2"), Value: relay[0].Value, Headers: relay[0].Headers}
	chk = run(bad)
	if chk.Reorders != 1 || chk.Dupes != 1 || chk.BadKey != 1 || chk.Missing != 0 || chk.OK() {
		t.Fatalf("bad output: %s", chk.summary())
	}
	if chk = run(relay[:1]); chk.Missing != 1 {
		t.Fatalf("missing event: %s", chk.summary())
	}
}

func TestParsePeerRates(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil || !slices.Equal(c.peerRates, []float64{2000, 500, 50}) || !c.scenarios["debezium"] {
		t.Fatalf("defaults: %v %v %v", c.peerRates, c.scenarios, err)
	}
	if c, err = parseFlags([]string{"-peer-rates", "1000", "-scenarios", "debezium"}); err != nil || !slices.Equal(c.peerRates, []float64{1000}) {
		t.Fatalf("-peer-rates 1000: %v %v", c.peerRates, err)
	}
	if _, err := parseFlags([]string{"-peer-rates", "fast"}); err == nil {
		t.Fatal("-peer-rates fast was accepted")
	}
	if c.peerRounds != 2 || !slices.Equal(c.roundRates, []float64{2000, 500}) {
		t.Fatalf("round defaults: %d at %v", c.peerRounds, c.roundRates)
	}
	if c, err = parseFlags([]string{"-peer-rounds", "0", "-round-rates", "2000,500"}); err != nil || c.peerRounds != 0 || !slices.Equal(c.roundRates, []float64{2000, 500}) {
		t.Fatalf("-peer-rounds 0 -round-rates 2000,500: %d %v %v", c.peerRounds, c.roundRates, err)
	}
	for _, bad := range [][]string{{"-peer-rounds", "-1"}, {"-round-rates", "0"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%v was accepted", bad)
		}
	}
}

func TestParsePeers(t *testing.T) {
	c, err := parseFlags([]string{"-peers", "relay-row, debezium"})
	if err != nil || !c.peers["relay-row"] || !c.peers["debezium"] || c.peers["relay-snapshot"] {
		t.Fatalf("-peers relay-row,debezium: %v %v", c.peers, err)
	}
	if c, err = parseFlags(nil); err != nil || c.peers != nil {
		t.Fatalf("default: %v %v (want every publisher: nil)", c.peers, err)
	}
}

// The floor is reported beside the goal Debezium's p99 sets, and says when the goal lies below it.
func TestFloorReport(t *testing.T) {
	z := &PeerResult{Key: peerDebezium, Latency: []*LatencyResult{{Rate: 2000, P99: 48, Measured: true}, {Rate: 500, P99: 30, Measured: true}}}
	cases := map[string]struct {
		floor []*LatencyResult
		want  []string
		not   []string
	}{
		"below the goal": {
			floor: []*LatencyResult{{Rate: 2000, P50: 1, P99: 9, CommitP99: 2, Measured: true}},
			want:  []string{"at 2,000 events/s p50 1.0, p99 9.0 ms", "goal of 16.0 ms (a third of Debezium's 48.0)"},
			not:   []string{"below the floor"},
		},
		"above the goal": {
			floor: []*LatencyResult{{Rate: 2000, P99: 9, Measured: true}, {Rate: 500, P99: 12, Measured: true}},
			want:  []string{"at 500 events/s", "goal of 10.0 ms", "the goal lies below the floor"},
		},
		"none measured": {floor: []*LatencyResult{{Rate: 2000, Err: "boom"}}, not: []string{"floor"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			writeDebeziumFloor(&b, &DebeziumResult{Peers: []*PeerResult{z}, Floor: c.floor})
			for _, w := range c.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, b.String())
				}
			}
			for _, n := range c.not {
				if strings.Contains(b.String(), n) {
					t.Errorf("report has %q:\n%s", n, b.String())
				}
			}
		})
	}
}
