package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// EnvelopesResult is the envelopes scenario: what CloudEvents (binary, structured) and tracing
// cost per event, against the same relay without them, at the latency scenario's rate under
// snapshot tracking, in one run.
type EnvelopesResult struct {
	Runs []*LatencyResult `json:"runs"`
	// Spans is how many spans the scenario's OTLP receiver got during the tracing run.
	Spans int64 `json:"spans"`
}

// envelopeEnv is what the variants' flags point at: the OTLP receiver, the schema registry
// ("" when it could not be started) and the directory of the schema the relay registers.
type envelopeEnv struct{ otlp, registry, schemaDir string }

// envelopeVariants are the runs of the envelopes scenario: a name and the relay's extra flags
// (nil, error: the variant cannot run).
var envelopeVariants = []struct {
	name string
	args func(envelopeEnv) ([]string, error)
}{
	{"warm-up", func(envelopeEnv) ([]string, error) { return nil, nil }}, // the broker's JIT warms up: not reported
	{"none", func(envelopeEnv) ([]string, error) { return nil, nil }},
	{"cloudevents-binary", func(envelopeEnv) ([]string, error) {
		return []string{"--cloudevents", string(contract.CloudEventsBinary)}, nil
	}},
	{"cloudevents-structured", func(envelopeEnv) ([]string, error) {
		return []string{"--cloudevents", string(contract.CloudEventsStructured)}, nil
	}},
	{"tracing", func(ee envelopeEnv) ([]string, error) { return []string{"--otlp-endpoint", ee.otlp}, nil }},
	{"schema-registry-json", func(ee envelopeEnv) ([]string, error) { return ee.schemaArgs(false) }},
	{"schema-registry-json-validated", func(ee envelopeEnv) ([]string, error) { return ee.schemaArgs(true) }},
}

// schemaArgs are the flags of the schema registry variants: JSON payloads framed, the event
// type's schema registered from schemaDir, and with validate every payload checked against it.
func (ee envelopeEnv) schemaArgs(validate bool) ([]string, error) {
	if ee.registry == "" {
		return nil, errors.New("no schema registry (hack/registry.sh start failed: Java 21 or newer is needed)")
	}
	args := []string{"--schema-registry-url", ee.registry, "--schema-format", string(contract.SchemaJSON),
		"--schema-subject-strategy", string(contract.SubjectRecord), "--schema-dir", ee.schemaDir}
	if validate {
		args = append(args, "--schema-validate")
	}
	return args, nil
}

// latencyEventSchema is the JSON Schema of the latency writers' events (seqPayload), which the
// schema-registry-json variant registers and validates every payload against.
const latencyEventSchema = `{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
 "properties": {"seq": {"type": "integer"}, "order_id": {"type": "string"}, "amount": {"type": "number"},
  "currency": {"type": "string", "minLength": 3, "maxLength": 3}, "note": {"type": "string"}},
 "required": ["seq", "order_id", "amount", "currency"]}`

// startRegistry starts a schema registry (hack/registry.sh) for the scenario and returns the
// base URL of its Confluent-compatible API and a stop function.
func startRegistry(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "outbox-bench-registry.")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.CommandContext(ctx, "hack/registry.sh", "start", dir)
	cmd.Env = append(os.Environ(), fmt.Sprintf("REGISTRY_OWNER_PID=%d", os.Getpid()))
	out, err := cmd.Output()
	stop := func() { _ = exec.Command("hack/registry.sh", "clean", dir).Run() }
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("hack/registry.sh start: %w", err)
	}
	return strings.TrimSpace(string(out)), stop, nil
}

// spanCounter is an OTLP/gRPC trace receiver in the benchmark process that counts what it gets.
type spanCounter struct {
	coltracepb.UnimplementedTraceServiceServer
	n atomic.Int64
}

func (s *spanCounter) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.n.Add(int64(len(ss.Spans)))
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// scenarioEnvelopes runs the latency measurement once per variant: a snapshot relay polling
// (the defaults) with --cloudevents binary, structured, or --otlp-endpoint (every event traced,
// to a receiver in this process), and without any, interleaved in that order.
func (e *env) scenarioEnvelopes(ctx context.Context, res *Results) {
	er := &EnvelopesResult{}
	res.Envelopes = er
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		res.note("envelopes: %v", err)
		return
	}
	srv := grpc.NewServer()
	counter := &spanCounter{}
	coltracepb.RegisterTraceServiceServer(srv, counter)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	ee := envelopeEnv{otlp: "http://" + lis.Addr().String()}
	if url, stop, err := startRegistry(ctx); err != nil {
		res.note("envelopes: %v", err)
	} else {
		defer stop()
		ee.registry = url
		ee.schemaDir, err = os.MkdirTemp("", "outbox-bench-schemas.")
		if err == nil {
			defer os.RemoveAll(ee.schemaDir)
			err = os.WriteFile(filepath.Join(ee.schemaDir, "OrderPlaced.json"), []byte(latencyEventSchema), 0o600)
		}
		if err != nil {
			res.note("envelopes: %v", err)
			ee.registry = ""
		}
	}
	for _, v := range envelopeVariants {
		args, argsErr := v.args(ee)
		lr := &LatencyResult{Rate: e.cfg.latencyRate, Writers: 8, Snapshot: true, PollMs: ms(contract.PollInterval),
			Envelope: v.name, relayArgs: args}
		er.Runs = append(er.Runs, lr)
		if argsErr != nil {
			lr.Err = argsErr.Error()
			progress("envelopes: %s: not measured: %v", v.name, argsErr)
			continue
		}
		progress("envelopes: %s", v.name)
		before := counter.n.Load()
		if err := e.runLatency(ctx, lr); err != nil {
			lr.Err = err.Error()
			progress("envelopes: %s: FAILED: %v", v.name, err)
		}
		if v.name == "tracing" {
			er.Spans = counter.n.Load() - before
		}
	}
}

// writeEnvelopes writes the envelopes section.
func writeEnvelopes(b *strings.Builder, res *Results) {
	er := res.Envelopes
	var runs []*LatencyResult
	var base *LatencyResult
	if er != nil {
		for _, lr := range er.Runs {
			switch {
			case lr.Envelope == "warm-up":
				continue
			case lr.Envelope == "none" && lr.Measured && lr.CPU != nil:
				base = lr
			}
			runs = append(runs, lr)
		}
	}
	if base == nil {
		return
	}
	per := func(lr *LatencyResult, s float64) float64 { return s / (lr.Achieved * lr.CPU.Wall) * 1e6 }
	total := func(lr *LatencyResult) float64 {
		return per(lr, lr.CPU.Relay+lr.CPU.PostgresRelay+lr.CPU.Kafka)
	}
	fmt.Fprintf(b, "## CloudEvents, Schema Registry framing and tracing: what they cost per event\n\n")
	fmt.Fprintf(b, "The latency measurement at %s events/s (snapshot tracking, polling), once per variant in one run: the relay "+
		"as it is, with `--cloudevents binary` (the payload as the value, the attributes as `ce_` headers), with `--cloudevents "+
		"structured` (the whole event as a JSON value), with `--otlp-endpoint` (a producer span per event, every event "+
		"sampled, exported over OTLP/gRPC to a receiver in the benchmark process, which got %s spans), and in the Schema "+
		"Registry's wire format (`--schema-registry-url` to an Apicurio Registry 3.3.3 started by hack/registry.sh, "+
		"`--schema-format json`, the event type's JSON Schema registered from `--schema-dir`; then also every payload "+
		"validated against it, `--schema-validate`), after a warm-up run "+
		"of the first (the broker's JIT). CPU µs per event: the relay, its PostgreSQL backends, the broker. The variants run in "+
		"this order and the broker's figure still falls from run to run as it warms up: compare them on the relay's column, "+
		"what the option itself costs.\n\n", fmtInt(base.Rate), fmtInt(float64(er.Spans)))
	fmt.Fprintf(b, "| variant | p50 / p99 ms | relay µs/event | vs none | its PostgreSQL backends | broker | total | vs none |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, lr := range runs {
		if !lr.Measured || lr.CPU == nil {
			fmt.Fprintf(b, "| %s | %s | | | | | | |\n", lr.Envelope, orDash(firstLine(lr.Err, 80)))
			continue
		}
		fmt.Fprintf(b, "| %s | %.1f / %.1f | %.0f | %.2fx | %.0f | %.0f | %.0f | %.2fx |\n", lr.Envelope, lr.P50, lr.P99,
			per(lr, lr.CPU.Relay), per(lr, lr.CPU.Relay)/per(base, base.CPU.Relay),
			per(lr, lr.CPU.PostgresRelay), per(lr, lr.CPU.Kafka), total(lr), total(lr)/total(base))
	}
	fmt.Fprintln(b)
}
