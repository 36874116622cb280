package registrytest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/test/registrytest"
)

func TestMain(m *testing.M) { os.Exit(registrytest.Run(m)) }

// A JSON Schema registered through the Confluent-compatible API gets an id, and the schema is
// read back by that id.
func TestRegistry(t *testing.T) {
	url := registrytest.URL(t)
	t.Logf("schema registry: %s", url)
	client := &http.Client{Timeout: 30 * time.Second}
	const contentType = "application/vnd.schemaregistry.v1+json"

	// Apicurio 3.3.3 detects the type from the content and refuses a bare {"type":"object"}
	// ("Failed to discover artifact type from content.", 42201) even with schemaType JSON;
	// with $schema it is recognised as a JSON Schema.
	schema := `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`
	body, err := json.Marshal(map[string]string{"schemaType": "JSON", "schema": schema})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Post(url+"/subjects/probe-value/versions", contentType, strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	var registered struct {
		ID int `json:"id"`
	}
	decode(t, resp, &registered)
	if registered.ID <= 0 {
		t.Fatalf("registered schema id %d, want > 0", registered.ID)
	}

	req, err := http.NewRequest(http.MethodGet, url+"/schemas/ids/"+strconv.Itoa(registered.ID), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", contentType)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Schema     string `json:"schema"`
		SchemaType string `json:"schemaType"`
	}
	decode(t, resp, &got)
	if got.SchemaType != "JSON" {
		t.Errorf("schemaType %q, want JSON", got.SchemaType)
	}
	var gotSchema, wantSchema any
	if err := json.Unmarshal([]byte(got.Schema), &gotSchema); err != nil {
		t.Fatalf("schema %q: %v", got.Schema, err)
	}
	_ = json.Unmarshal([]byte(schema), &wantSchema)
	if g, w := mustJSON(t, gotSchema), mustJSON(t, wantSchema); g != w {
		t.Errorf("schema %s, want %s", g, w)
	}
}

// decode fails the test unless resp is a 200 whose JSON body decodes into v.
func decode(t *testing.T, resp *http.Response, v any) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %s: %s", resp.Request.Method, resp.Request.URL, resp.Status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s %s: %v: %s", resp.Request.Method, resp.Request.URL, err, b)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
