// Schema Registry framing: each payload published in the registry's wire format (a zero magic
// byte, the schema's id in four bytes, big-endian, and for Protobuf the message indexes), the
// schema looked up per subject in a Confluent-compatible registry (or registered from
// --schema-dir), cached.

package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// SchemaSettings are the relay's Schema Registry settings (--schema-*).
type SchemaSettings struct {
	// URL is the base of the registry's Confluent-compatible API (empty: no framing).
	URL      string
	Format   contract.SchemaFormat
	Strategy contract.SubjectStrategy
	// Validate checks each payload against its schema: one that does not fit is poison.
	Validate bool
	// Dir holds schemas named <event type>.json, .avsc or .proto, registered under their
	// subjects; an event type without a file is looked up (the subject's latest version).
	Dir    string
	CAFile string
	// CertFile and KeyFile are the relay's client certificate for the registry (mutual TLS).
	CertFile, KeyFile string
	// Username and Password are the registry's basic-auth credentials (environment only).
	Username, Password string
}

func (s *SchemaSettings) enabled() bool { return s.URL != "" }

// validate adds s's problems to p; ce is the relay's CloudEvents mode.
func (s *SchemaSettings) validate(p *problems, ce contract.CloudEvents) {
	if !s.Format.Valid() {
		p.add("--schema-format %q: want %q, %q, %q or %q", s.Format, contract.SchemaNone, contract.SchemaJSON, contract.SchemaAvro, contract.SchemaProtobuf)
	}
	if !s.Strategy.Valid() {
		p.add("--schema-subject-strategy %q: want %q, %q or %q", s.Strategy, contract.SubjectTopic, contract.SubjectRecord, contract.SubjectTopicRecord)
	}
	if s.URL == "" {
		if s.Format != contract.SchemaNone && s.Format.Valid() {
			p.add("--schema-format %s needs --schema-registry-url", s.Format)
		}
		if s.Validate || s.Dir != "" || s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" || s.Username != "" || s.Password != "" {
			p.add("--schema-validate, --schema-dir, --schema-registry-ca-file, -cert-file, -key-file and the registry's credentials need --schema-registry-url")
		}
		return
	}
	u, err := url.Parse(s.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		p.add("--schema-registry-url: want an http:// or https:// URL, such as http://registry:8081/apis/ccompat/v7")
	case u.User != nil:
		p.add("--schema-registry-url: credentials do not belong in the URL; set %s and %s", contract.EnvRegistryUsername, contract.EnvRegistryPassword)
	case (s.CAFile != "" || s.CertFile != "") && u.Scheme != "https":
		p.add("--schema-registry-ca-file and --schema-registry-cert-file need an https:// --schema-registry-url")
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		p.add("--schema-registry-cert-file and --schema-registry-key-file go together")
	}
	if s.Format == contract.SchemaNone {
		p.add("--schema-registry-url needs --schema-format (json, avro or protobuf)")
	}
	if (s.Username == "") != (s.Password == "") {
		p.add("the registry's credentials need both %s and %s", contract.EnvRegistryUsername, contract.EnvRegistryPassword)
	}
	if ce == contract.CloudEventsStructured {
		p.add("--schema-registry-url with --cloudevents structured: the value would be the envelope, not the framed payload (use binary mode)")
	}
}

// schemaTTL is how long a subject's schema is used before it is asked for again; a registry
// that does not answer then leaves the known one in use.
const schemaTTL = 5 * time.Minute

// schemaMissTTL is how long a subject the registry does not know stays unknown (its events are
// poison meanwhile) before it is asked for again.
const schemaMissTTL = 10 * time.Second

// registryTimeout bounds one request to the registry.
const registryTimeout = 5 * time.Second

// errRegistryUnavailable wraps what kept the relay from the registry (it did not answer, or
// refused the relay's credentials): an outage, not the event's fault.
type errRegistryUnavailable struct{ err error }

func (e errRegistryUnavailable) Error() string {
	return "schema registry unavailable: " + e.err.Error()
}
func (e errRegistryUnavailable) Unwrap() error { return e.err }

func registryUnavailable(err error) bool {
	var e errRegistryUnavailable
	return errors.As(err, &e)
}

// schemaEntry is a subject's schema as the relay uses it.
type schemaEntry struct {
	header  []byte             // the wire format's prefix: magic byte, id, message indexes
	check   func([]byte) error // nil unless --schema-validate
	bad     string             // why the subject's events are poison ("" when usable)
	fetched time.Time
}

// schemaRegistry frames payloads (see the file's comment). Lookups from the loop use the cache;
// a subject not in it is asked for at once, one whose entry is older than schemaTTL in the
// background, the old entry meanwhile.
type schemaRegistry struct {
	cfg    SchemaSettings
	client *http.Client
	files  map[string]string // --schema-dir: schema text by event type

	mu         sync.Mutex
	cache      map[string]*schemaEntry // by subject
	refreshing map[string]bool
	// down says why the loop's last lookup reached no registry (nil once one answers; a
	// background refresh that fails leaves it, the known schema in use).
	down atomic.Pointer[string]
}

func newSchemaRegistry(cfg SchemaSettings) (*schemaRegistry, error) {
	if !cfg.enabled() {
		return nil, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.CAFile != "" || cfg.CertFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("--schema-registry-ca-file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--schema-registry-ca-file %s: no PEM certificate in it", cfg.CAFile)
			}
		}
		if cfg.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("--schema-registry-cert-file, --schema-registry-key-file: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		tr.TLSClientConfig = tc
	}
	s := &schemaRegistry{cfg: cfg, client: &http.Client{Transport: tr, Timeout: registryTimeout},
		cache: map[string]*schemaEntry{}, refreshing: map[string]bool{}}
	if cfg.Dir != "" {
		files, err := readSchemaDir(cfg.Dir, cfg.Format)
		if err != nil {
			return nil, err
		}
		s.files = files
	}
	return s, nil
}

// schemaExt is the file extension of format's schemas in --schema-dir.
func schemaExt(f contract.SchemaFormat) string {
	switch f {
	case contract.SchemaAvro:
		return ".avsc"
	case contract.SchemaProtobuf:
		return ".proto"
	}
	return ".json"
}

// readSchemaDir reads dir's schemas of format by event type (a mounted ConfigMap's files;
// entries that start with a dot, its own bookkeeping, and other extensions are left alone).
func readSchemaDir(dir string, format contract.SchemaFormat) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--schema-dir: %w", err)
	}
	ext := schemaExt(format)
	files := map[string]string{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ext) || len(name) == len(ext) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("--schema-dir: %w", err)
		}
		files[strings.TrimSuffix(name, ext)] = string(b)
	}
	return files, nil
}

// frame returns value framed for an event of eventType published to topic: noSchema says why
// the event is poison (its subject has no usable schema, or the payload does not fit it), err
// that the registry could not be asked (an outage). A nil value (a tombstone) stays nil.
func (s *schemaRegistry) frame(ctx context.Context, topic, eventType string, value, arena []byte) (framed, grown []byte, noSchema string, err error) {
	if value == nil {
		return nil, arena, "", nil
	}
	subject := s.cfg.Strategy.Subject(topic, eventType)
	e, err := s.entry(ctx, subject, eventType)
	if err != nil {
		return nil, arena, "", err
	}
	if e.bad != "" {
		return nil, arena, e.bad, nil
	}
	if e.check != nil {
		if cerr := e.check(value); cerr != nil {
			// One line: the validator's report spans several (a header and the row's error hold it).
			why := strings.Join(strings.Fields(strings.ReplaceAll(cerr.Error(), "\n", "; ")), " ")
			return nil, arena, fmt.Sprintf("poison: the payload does not fit the %s schema of subject %q: %s", s.cfg.Format, subject, truncate(why, 500)), nil
		}
	}
	at := len(arena)
	arena = append(arena, e.header...)
	arena = append(arena, value...)
	return arena[at:len(arena):len(arena)], arena, "", nil
}

// entry returns subject's schema: from the cache, or asked for now when the cache has none (or
// only a miss older than schemaMissTTL); an entry older than schemaTTL is refreshed in the
// background.
func (s *schemaRegistry) entry(ctx context.Context, subject, eventType string) (*schemaEntry, error) {
	now := time.Now()
	s.mu.Lock()
	e := s.cache[subject]
	switch {
	case e != nil && e.bad == "" && now.Sub(e.fetched) > schemaTTL && !s.refreshing[subject]:
		s.refreshing[subject] = true
		go s.refresh(subject, eventType)
	case e != nil && e.bad != "" && now.Sub(e.fetched) > schemaMissTTL:
		e = nil
	}
	s.mu.Unlock()
	if e != nil {
		return e, nil
	}
	e, err := s.fetch(ctx, subject, eventType)
	if err != nil {
		msg := err.Error()
		s.down.Store(&msg)
		return nil, err
	}
	s.down.Store(nil)
	s.mu.Lock()
	s.cache[subject] = e
	s.mu.Unlock()
	return e, nil
}

// refresh asks for subject's schema again; a registry that does not answer leaves the entry
// in use (and retried after schemaTTL).
func (s *schemaRegistry) refresh(subject, eventType string) {
	ctx, cancel := context.WithTimeout(context.Background(), registryTimeout)
	defer cancel()
	e, err := s.fetch(ctx, subject, eventType)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.refreshing, subject)
	if err != nil {
		if old := s.cache[subject]; old != nil {
			old.fetched = time.Now()
		}
		return
	}
	s.cache[subject] = e
}

// registryAnswer is what the registry's API answers to a lookup or a registration.
type registryAnswer struct {
	ID         int    `json:"id"`
	Schema     string `json:"schema"`
	SchemaType string `json:"schemaType"`
	ErrorCode  int    `json:"error_code"`
	Message    string `json:"message"`
}

// fetch registers eventType's schema from --schema-dir under subject, or looks up subject's
// latest version, and compiles the entry.
func (s *schemaRegistry) fetch(ctx context.Context, subject, eventType string) (*schemaEntry, error) {
	text, register := s.files[eventType]
	var (
		ans    registryAnswer
		status int
		err    error
	)
	if register {
		body, _ := json.Marshal(map[string]string{"schema": text, "schemaType": s.cfg.Format.RegistryType()})
		status, err = s.call(ctx, http.MethodPost, "/subjects/"+url.PathEscape(subject)+"/versions", body, &ans)
		ans.Schema, ans.SchemaType = text, s.cfg.Format.RegistryType()
	} else {
		status, err = s.call(ctx, http.MethodGet, "/subjects/"+url.PathEscape(subject)+"/versions/latest", nil, &ans)
	}
	if err != nil {
		return nil, err
	}
	e := &schemaEntry{fetched: time.Now()}
	switch {
	case status == http.StatusNotFound:
		e.bad = fmt.Sprintf("poison: the schema registry has no schema under subject %q (strategy %s; register one, or give the relay one in --schema-dir)", subject, s.cfg.Strategy)
		return e, nil
	case status >= 300:
		what := "lookup"
		if register {
			what = "registration from --schema-dir"
		}
		e.bad = fmt.Sprintf("poison: schema %s of subject %q refused by the registry (HTTP %d, error %d): %s", what, subject, status, ans.ErrorCode, truncate(ans.Message, 300))
		return e, nil
	}
	got := ans.SchemaType
	if got == "" {
		got = "AVRO" // the registry's API leaves Avro's type out
	}
	if got != s.cfg.Format.RegistryType() {
		e.bad = fmt.Sprintf("poison: subject %q holds a %s schema, the relay's --schema-format is %s", subject, got, s.cfg.Format)
		return e, nil
	}
	if ans.ID < 0 || ans.ID > 1<<31-1 {
		e.bad = fmt.Sprintf("poison: subject %q: the registry answered schema id %d", subject, ans.ID)
		return e, nil
	}
	compiled, cerr := compileSchema(s.cfg.Format, ans.Schema, eventType, s.cfg.Validate)
	if cerr != nil {
		e.bad = fmt.Sprintf("poison: the %s schema of subject %q (id %d): %v", s.cfg.Format, subject, ans.ID, cerr)
		return e, nil
	}
	e.header = append([]byte{0, byte(ans.ID >> 24), byte(ans.ID >> 16), byte(ans.ID >> 8), byte(ans.ID)}, compiled.indexes...)
	e.check = compiled.check
	return e, nil
}

// call sends one request to the registry and decodes its JSON answer into ans. It returns the
// status of an answer, or an errRegistryUnavailable when none came, the registry failed (5xx)
// or refused the relay's credentials (401, 403).
func (s *schemaRegistry) call(ctx context.Context, method, path string, body []byte, ans *registryAnswer) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, registryTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(s.cfg.URL, "/")+path, rd)
	if err != nil {
		return 0, errRegistryUnavailable{err}
	}
	req.Header.Set("Accept", "application/vnd.schemaregistry.v1+json, application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/vnd.schemaregistry.v1+json")
	}
	if s.cfg.Username != "" {
		req.SetBasicAuth(s.cfg.Username, s.cfg.Password)
	}
	res, err := s.client.Do(req)
	if err != nil {
		return 0, s.unavailable(stripURLError(err))
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		return 0, s.unavailable(err)
	}
	switch {
	case res.StatusCode >= 500:
		return 0, s.unavailable(fmt.Errorf("HTTP %d from %s %s: %s", res.StatusCode, method, path, truncate(string(raw), 200)))
	case res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden:
		return 0, s.unavailable(fmt.Errorf("HTTP %d from %s %s: the registry refused the relay's credentials", res.StatusCode, method, path))
	}
	if err := json.Unmarshal(raw, ans); err != nil && res.StatusCode < 300 {
		return 0, s.unavailable(fmt.Errorf("%s %s: the answer is not the registry API's JSON: %w", method, path, err))
	}
	return res.StatusCode, nil
}

func (s *schemaRegistry) unavailable(err error) error { return errRegistryUnavailable{err} }

// stripURLError drops the request URL from a client error (the registry's address is in the
// relay's settings; its error text is what says why).
func stripURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}
