package plugin

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/outbox-operator/outbox-operator/outboxdb"
)

func TestCell(t *testing.T) {
	ts := time.Date(2026, 12, 1, 22, 5, 7, 0, time.FixedZone("CET", 3600))
	var nilTime *time.Time
	var nilInt *int64
	n := int64(7)
	cases := map[string]struct {
		in   any
		want string
	}{
		"nil":            {nil, "-"},
		"empty string":   {"", "-"},
		"nil *string":    {(*string)(nil), "-"},
		"string":         {"abc", "abc"},
		"multi-line":     {"a\nb\t c", "a b c"},
		"long":           {strings.Repeat("x", 130), strings.Repeat("x", 117) + "..."},
		"time in UTC":    {ts, "2026-12-01T21:05:07Z"},
		"zero time":      {time.Time{}, "-"},
		"nil *time.Time": {nilTime, "-"},
		"nil *int64":     {nilInt, "-"},
		"*int64":         {&n, "7"},
		"int":            {42, "42"},
	}
	for name, c := range cases {
		if got := cell(c.in); got != c.want {
			t.Errorf("%s: cell(%v) = %q, want %q", name, c.in, got, c.want)
		}
	}
}

func TestAgeAndBytes(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 42 * time.Second: "42s", 61 * time.Second: "1m1s",
		3*time.Hour + 5*time.Minute: "3h5m", 50 * time.Hour: "2d2h",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%s) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536 * 1024: "1.5 MiB", 3 << 30: "3.0 GiB"} {
		if got := bytesIEC(n); got != want {
			t.Errorf("bytesIEC(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseEventRef(t *testing.T) {
	cases := map[string]struct {
		want eventRef
		bad  bool
	}{
		"42":                                     {want: eventRef{id: 42}},
		" 7 ":                                    {want: eventRef{id: 7}},
		"0":                                      {bad: true},
		"-3":                                     {bad: true},
		"0F8FAD5B-D9CB-469F-A165-70867728950E":   {want: eventRef{eventID: "0f8fad5b-d9cb-469f-a165-70867728950e"}},
		"0f8fad5bd9cb469fa16570867728950e":       {want: eventRef{eventID: "0f8fad5bd9cb469fa16570867728950e"}},
		"order-42":                               {bad: true},
		"0f8fad5b-d9cb-469f-a165-70867728950e-x": {bad: true},
	}
	for in, c := range cases {
		got, err := parseEventRef(in)
		var u usageError
		switch {
		case c.bad && (err == nil || !errors.As(err, &u)):
			t.Errorf("parseEventRef(%q) = %+v, %v; want a usage error", in, got, err)
		case !c.bad && (err != nil || got != c.want):
			t.Errorf("parseEventRef(%q) = %+v, %v; want %+v", in, got, err, c.want)
		}
	}
}

func TestCursorXmin(t *testing.T) {
	cases := map[string]struct {
		rows []outboxdb.CursorRow
		want string
	}{
		"row tracking":          {nil, ""},
		"before the first":      {[]outboxdb.CursorRow{{Snap: "10:12:"}, {Snap: ""}}, ""},
		"lowest of the rows":    {[]outboxdb.CursorRow{{Snap: "100:120:101"}, {Snap: "90:95:"}}, "90"},
		"unparseable snapshot":  {[]outboxdb.CursorRow{{Snap: "x:y:"}}, ""},
		"one row, large values": {[]outboxdb.CursorRow{{Snap: "18446744073709551000:18446744073709551001:"}}, "18446744073709551000"},
	}
	for name, c := range cases {
		if got := cursorXmin(c.rows); got != c.want {
			t.Errorf("%s: cursorXmin = %q, want %q", name, got, c.want)
		}
	}
}

func TestBacklogOf(t *testing.T) {
	id := func(v int64) *int64 { return &v }
	exact := backlogOf(outboxdb.Backlog{Counted: 12, FirstID: id(1), LastCountedID: id(12), LastID: id(12), OldestAgeSeconds: 75, Limit: 100})
	if exact.Pending != "12" || !exact.Exact || exact.Lag != "1m15s" {
		t.Errorf("exact backlog: %+v", exact)
	}
	est := backlogOf(outboxdb.Backlog{Counted: 100, FirstID: id(1), LastCountedID: id(100), LastID: id(1000), Limit: 100})
	if est.Exact || est.PendingCount != 1000 || !strings.HasPrefix(est.Pending, "about 1000") {
		t.Errorf("estimated backlog: %+v", est)
	}
}

func TestPrintFormats(t *testing.T) {
	v := struct {
		Name string `json:"name"`
	}{"orders"}
	for format, want := range map[string]string{"json": "{\n  \"name\": \"orders\"\n}\n", "yaml": "name: orders\n", "table": "A  B\n-  orders\n"} {
		var out bytes.Buffer
		o := &Options{Out: &out, Output: format}
		if err := o.print(v, func(w io.Writer) { row(w, "A", "B"); row(w, nil, v.Name) }); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Errorf("-o %s: %q, want %q", format, out.String(), want)
		}
	}
	if err := (&Options{Output: "xml"}).checkOutput(); err == nil {
		t.Error("-o xml accepted")
	}
}
