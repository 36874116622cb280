package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outbox-operator/outbox-operator/internal/contract"
)

// compiledSchema is what framing needs of a schema: the message indexes that follow the id in
// the wire format (Protobuf only), and the payload's check (with validate).
type compiledSchema struct {
	indexes []byte
	check   func([]byte) error
}

// compileSchema reads text, a schema of format, for the events of eventType. A schema that does
// not compile is an error (its subject's events are poison).
func compileSchema(format contract.SchemaFormat, text, eventType string, validate bool) (compiledSchema, error) {
	switch format {
	case contract.SchemaJSON:
		return compileJSONSchema(text, validate)
	case contract.SchemaAvro:
		return compileAvro(text, validate)
	case contract.SchemaProtobuf:
		return compileProtobuf(text, eventType, validate)
	}
	return compiledSchema{}, fmt.Errorf("no schema format %q", format)
}

// noLoader refuses every external reference of a JSON Schema: the relay reads no files and no
// URLs on a schema's say (the drafts' meta-schemas are built in).
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("the schema refers to %s: the relay resolves no external references", url)
}

func compileJSONSchema(text string, validate bool) (compiledSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(text)))
	if err != nil {
		return compiledSchema{}, fmt.Errorf("not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	if err := c.AddResource("schema.json", doc); err != nil {
		return compiledSchema{}, err
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		return compiledSchema{}, err
	}
	if !validate {
		return compiledSchema{}, nil
	}
	return compiledSchema{check: func(payload []byte) error {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
		if err != nil {
			return err
		}
		if err := sch.Validate(v); err != nil {
			// The report's first line names the schema's resource (ours, not the user's): the
			// lines after it say what does not fit.
			msg := err.Error()
			if i := strings.IndexByte(msg, '\n'); i >= 0 && strings.HasPrefix(msg, "jsonschema validation failed") {
				msg = msg[i+1:]
			}
			return errors.New(strings.TrimSpace(msg))
		}
		return nil
	}}, nil
}

func compileAvro(text string, validate bool) (compiledSchema, error) {
	sch, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return compiledSchema{}, err
	}
	if !validate {
		return compiledSchema{}, nil
	}
	return compiledSchema{check: func(payload []byte) error {
		var v any
		return avro.Unmarshal(sch, payload, &v)
	}}, nil
}

// compileProtobuf reads a self-contained .proto schema (the well-known types may be imported):
// the message of the events is the one whose full name is eventType, or else the schema's first.
func compileProtobuf(text, eventType string, validate bool) (compiledSchema, error) {
	const name = "schema.proto"
	comp := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{name: text}),
	})}
	files, err := comp.Compile(context.Background(), name)
	if err != nil {
		return compiledSchema{}, err
	}
	fd := files.FindFileByPath(name)
	if fd == nil || fd.Messages().Len() == 0 {
		return compiledSchema{}, errors.New("the schema declares no message")
	}
	md, path := findMessage(fd.Messages(), protoreflect.FullName(eventType), nil)
	if md == nil {
		md, path = fd.Messages().Get(0), []int{0}
	}
	out := compiledSchema{indexes: messageIndexes(path)}
	if validate {
		out.check = func(payload []byte) error {
			return proto.Unmarshal(payload, dynamicpb.NewMessage(md))
		}
	}
	return out, nil
}

// findMessage returns the message named full among msgs and their nested messages, and its path
// of indexes.
func findMessage(msgs protoreflect.MessageDescriptors, full protoreflect.FullName, path []int) (protoreflect.MessageDescriptor, []int) {
	for i := range msgs.Len() {
		m := msgs.Get(i)
		p := append(append([]int(nil), path...), i)
		if m.FullName() == full {
			return m, p
		}
		if found, fp := findMessage(m.Messages(), full, p); found != nil {
			return found, fp
		}
	}
	return nil, nil
}

// messageIndexes encodes a message's path in Confluent's Protobuf wire format: the first
// message ([0]) as a single zero byte, any other as the count and then each index, as zigzag
// varints.
func messageIndexes(path []int) []byte {
	if len(path) == 1 && path[0] == 0 {
		return []byte{0}
	}
	out := binary.AppendVarint(nil, int64(len(path)))
	for _, i := range path {
		out = binary.AppendVarint(out, int64(i))
	}
	return out
}
