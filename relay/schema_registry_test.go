package relay

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/test/kafkatest"
	"github.com/outbox-operator/outbox-operator/test/registrytest"
)

// Apicurio's Confluent-compatible API guesses a JSON Schema's type from its text: a bare
// {"type": "object"} is refused; "$schema" makes it one.
const orderJSONSchema = `{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
 "properties": {"total": {"type": "integer"}}, "required": ["total"]}`

const orderAvroSchema = `{"type": "record", "name": "OrderPlaced", "namespace": "shop",
 "fields": [{"name": "id", "type": "string"}, {"name": "total", "type": "long"}]}`

const orderProto = `syntax = "proto3";
package shop;
message OrderPlaced { string id = 1; int64 total = 2; }
message OrderShipped { string id = 1; string carrier = 2; }
`

// registryClient is the independent side: franz-go's registry client (schemas by id) and its
// wire-format header codec decode what the relay published.
func registryClient(t *testing.T, url string) *sr.Client {
	t.Helper()
	cl, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// decodeFramed reads a record's wire format with franz-go's codec: the schema id (looked up in
// the registry: its text) and the rest, after the message indexes when protobuf.
func decodeFramed(t *testing.T, cl *sr.Client, rec kafkatest.Record, protobuf bool) (schema sr.Schema, index []int, payload []byte) {
	t.Helper()
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(rec.Value)
	if err != nil {
		t.Fatalf("%s: not in the registry's wire format: %v (value %q)", rec.Key, err, rec.Value)
	}
	if protobuf {
		if index, rest, err = h.DecodeIndex(rest, 8); err != nil {
			t.Fatalf("%s: message indexes: %v", rec.Key, err)
		}
	}
	if schema, err = cl.SchemaByID(context.Background(), id); err != nil {
		t.Fatalf("%s: schema id %d: %v", rec.Key, id, err)
	}
	return schema, index, rest
}

func insertEvents(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// TestSchemaRegistryJSON: with --schema-format json, subjects by topic, looked up and validated,
// a consumer decoding the registry's wire format with franz-go's codec and the registry's schema
// by id reads the jsonb payload as it is; a payload that does not fit the schema is poison with
// a clear error (dead-lettered here, unframed), and the events of an event type whose subject
// the registry does not know too.
func TestSchemaRegistryJSON(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.schema.json", 2)
	reg := registrytest.URL(t)
	cl := registryClient(t, reg)
	ctx := context.Background()
	created, err := cl.CreateSchema(ctx, topic+"-value", sr.Schema{Schema: orderJSONSchema, Type: sr.TypeJSON})
	if err != nil {
		t.Fatal(err)
	}
	dlq := topic + ".dlq"
	k.CreateTopic(t, dlq, 1)
	insertEvents(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
('order', 'o-1', 'OrderPlaced', '{"total": 42}'), ('order', 'o-2', 'OrderPlaced', '{"total": "many"}'),
('order', 'o-3', 'OrderPlaced', '{"total": 7}')`)
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.Schemas = SchemaSettings{URL: reg, Format: contract.SchemaJSON, Strategy: contract.SubjectTopic, Validate: true}
	cfg.PoisonPolicy, cfg.DeadLetterTopic = PoisonDeadLetter, dlq
	startRelay(t, cfg, "relay")
	c := newCollector(t, k, topic, dlq)
	c.waitDistinct(t, 3, time.Minute)
	for _, rec := range c.recs {
		switch rec.Topic {
		case topic:
			schema, _, payload := decodeFramed(t, cl, rec, false)
			if schema.Schema != orderJSONSchema || schema.Type != sr.TypeJSON {
				t.Errorf("%s: schema %s %q, want the subject's", rec.Key, schema.Type, schema.Schema)
			}
			want := map[string]string{"o-1": `{"total": 42}`, "o-3": `{"total": 7}`}[rec.Key]
			if string(payload) != want {
				t.Errorf("%s: payload %q, want %q", rec.Key, payload, want)
			}
			if id, _, _ := (&sr.ConfluentHeader{}).DecodeID(rec.Value); id != created.ID {
				t.Errorf("%s: schema id %d, the subject's is %d", rec.Key, id, created.ID)
			}
		case dlq:
			if rec.Key != "o-2" || string(rec.Value) != `{"total": "many"}` ||
				!strings.Contains(rec.Headers[HeaderError], "does not fit the json schema of subject") ||
				!strings.Contains(rec.Headers[HeaderError], "at '/total': got string, want integer") || strings.Contains(rec.Headers[HeaderError], "\n") {
				t.Errorf("dead letter %s: value %q error %q", rec.Key, rec.Value, rec.Headers[HeaderError])
			}
		}
	}
	if n := countOn(c.recs, topic); n != 2 {
		t.Errorf("%d records on %s, want o-1 and o-3", n, topic)
	}

	// An event type whose subject (strategy record: the event type) the registry does not know.
	url2, pool2, k2, topic2 := newTopicDB(t, "relay.schema.missing", 1)
	k2.CreateTopic(t, topic2+".dlq", 1)
	insertEvents(t, pool2, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'o-9', $1, '{"total": 1}')`, "Unknown"+topic2)
	cfg2 := withTracking(testConfig(url2, k2.Brokers, topic2), TrackSnapshot)
	cfg2.Schemas = SchemaSettings{URL: reg, Format: contract.SchemaJSON, Strategy: contract.SubjectRecord}
	cfg2.PoisonPolicy, cfg2.DeadLetterTopic = PoisonDeadLetter, topic2+".dlq"
	startRelay(t, cfg2, "relay2")
	c2 := newCollector(t, k2, topic2+".dlq")
	c2.waitDistinct(t, 1, time.Minute)
	if e := c2.recs[0].Headers[HeaderError]; !strings.Contains(e, `no schema under subject "Unknown`+topic2+`"`) {
		t.Errorf("dead letter error %q, want the missing subject named", e)
	}
}

// TestSchemaRegistryAvro: with --schema-format avro and the record strategy, the relay registers
// the event type's schema from --schema-dir and frames payload_bytes; the consumer decodes each
// value with the schema the registry holds under the id it carries (hamba/avro).
func TestSchemaRegistryAvro(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.schema.avro", 2)
	reg := registrytest.URL(t)
	cl := registryClient(t, reg)
	// An event type of this test's own: the subject (record strategy) is the event type.
	evType := "shop.OrderPlaced" + strings.ReplaceAll(topic, ".", "")
	schemaText := strings.Replace(orderAvroSchema, `"name": "OrderPlaced"`, `"name": "`+strings.TrimPrefix(evType, "shop.")+`"`, 1)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, evType+".avsc"), []byte(schemaText), 0o600); err != nil {
		t.Fatal(err)
	}
	sch := avro.MustParse(schemaText)
	type order struct {
		ID    string `avro:"id"`
		Total int64  `avro:"total"`
	}
	for _, o := range []order{{"o-1", 42}, {"o-2", 7}} {
		b, err := avro.Marshal(sch, o)
		if err != nil {
			t.Fatal(err)
		}
		insertEvents(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload_bytes) VALUES ('order', $1, $2, $3)`, o.ID, evType, b)
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.Schemas = SchemaSettings{URL: reg, Format: contract.SchemaAvro, Strategy: contract.SubjectRecord, Dir: dir, Validate: true}
	startRelay(t, cfg, "relay")
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 2, time.Minute)
	latest, err := cl.SchemaByVersion(context.Background(), evType, -1)
	if err != nil {
		t.Fatalf("the relay registered no schema under subject %s: %v", evType, err)
	}
	for _, rec := range c.recs {
		schema, _, payload := decodeFramed(t, cl, rec, false)
		if schema.Type != sr.TypeAvro || schema.Schema == "" {
			t.Fatalf("%s: schema %s", rec.Key, schema.Type)
		}
		if id, _, _ := (&sr.ConfluentHeader{}).DecodeID(rec.Value); id != latest.ID {
			t.Errorf("%s: schema id %d, the subject's is %d", rec.Key, id, latest.ID)
		}
		var got order
		if err := avro.Unmarshal(avro.MustParse(schema.Schema), payload, &got); err != nil {
			t.Fatalf("%s: %v", rec.Key, err)
		}
		if got.ID != rec.Key || got.Total != map[string]int64{"o-1": 42, "o-2": 7}[rec.Key] {
			t.Errorf("%s: decoded %+v", rec.Key, got)
		}
	}
}

// TestSchemaRegistryProtobuf: with --schema-format protobuf and the topic-record strategy, the
// message indexes name the event type's message (the second of the schema: [1]), as franz-go's
// codec reads them; the payload follows unchanged.
func TestSchemaRegistryProtobuf(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.schema.proto", 1)
	reg := registrytest.URL(t)
	cl := registryClient(t, reg)
	if _, err := cl.CreateSchema(context.Background(), topic+"-shop.OrderShipped", sr.Schema{Schema: orderProto, Type: sr.TypeProtobuf}); err != nil {
		t.Fatal(err)
	}
	msg := []byte{0x0a, 0x03, 'o', '-', '1', 0x12, 0x03, 'd', 'h', 'l'} // id "o-1", carrier "dhl"
	insertEvents(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload_bytes) VALUES ('order', 'o-1', 'shop.OrderShipped', $1)`, msg)
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.Schemas = SchemaSettings{URL: reg, Format: contract.SchemaProtobuf, Strategy: contract.SubjectTopicRecord, Validate: true}
	startRelay(t, cfg, "relay")
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 1, time.Minute)
	schema, index, payload := decodeFramed(t, cl, c.recs[0], true)
	if schema.Type != sr.TypeProtobuf || len(index) != 1 || index[0] != 1 || string(payload) != string(msg) {
		t.Errorf("schema %s, indexes %v, payload %x; want protobuf, [1], %x", schema.Type, index, payload, msg)
	}
}

// TestSchemaRegistryOutage: a registry that does not answer is an outage, not the events' fault:
// nothing is published, parked or charged an attempt (the database says so), the relay is not
// ready and says why; the relay started again with the registry reachable publishes every event
// once.
func TestSchemaRegistryOutage(t *testing.T) {
	url, pool, k, topic := newTopicDB(t, "relay.schema.outage", 2)
	reg := registrytest.URL(t)
	cl := registryClient(t, reg)
	if _, err := cl.CreateSchema(context.Background(), topic+"-value", sr.Schema{Schema: orderJSONSchema, Type: sr.TypeJSON}); err != nil {
		t.Fatal(err)
	}
	// A registry that accepts connections and closes them at once, counting them: the relay's
	// lookups fail, and the count says it asked again after backing off.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var asked atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			asked.Add(1)
			conn.Close()
		}
	}()
	dead := "http://" + ln.Addr().String() + "/apis/ccompat/v7"
	for i := range 20 {
		insertEvents(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'OrderPlaced', '{"total": 1}')`, "o-"+string(rune('a'+i)))
	}
	cfg := withTracking(testConfig(url, k.Brokers, topic), TrackSnapshot)
	cfg.Schemas = SchemaSettings{URL: dead, Format: contract.SchemaJSON, Strategy: contract.SubjectTopic}
	r := startRelay(t, cfg, "relay-down")
	waitFor(t, time.Minute, "the relay to ask the registry three times, and say it is unavailable", func() bool {
		return asked.Load() >= 3 && strings.Contains(r.notReadyReason(), "schema registry unavailable")
	})
	r.stop(t)
	var parked, attempts int
	if err := pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM outbox_parked), (SELECT coalesce(sum(attempts), 0) FROM outbox)`).Scan(&parked, &attempts); err != nil {
		t.Fatal(err)
	}
	if parked != 0 || attempts != 0 || pendingRows(t, pool) != 20 {
		t.Errorf("after the outage: %d parked, %d attempts, %d pending; want 0, 0, 20", parked, attempts, pendingRows(t, pool))
	}
	if n, _ := k.CountBatches(t, topic); n != 0 {
		t.Errorf("%d records published while the registry was down", n)
	}
	cfg.Schemas.URL = reg
	startRelay(t, cfg, "relay-up")
	c := newCollector(t, k, topic)
	c.waitDistinct(t, 20, time.Minute)
	if len(c.recs) != 20 {
		t.Errorf("%d records for 20 events", len(c.recs))
	}
}

// countOn counts the records of recs on topic.
func countOn(recs []kafkatest.Record, topic string) int {
	n := 0
	for _, rec := range recs {
		if rec.Topic == topic {
			n++
		}
	}
	return n
}
