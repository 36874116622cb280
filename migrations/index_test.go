package migrations

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite INDEX.md from the migrations")

const indexFile = "INDEX.md"

// definition is one CREATE [OR REPLACE] FUNCTION or DROP FUNCTION of a migration.
type definition struct {
	file, args string
	line       int
	drop       bool
}

var (
	// The name runs up to the argument list: a template action ({{.Func "x"}}, {{.NotifyFunc}})
	// or a plain, possibly qualified, identifier.
	createFunc = regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([^\s(]+(?:\s[^\s(]+)*?)\s*\(`)
	dropFunc   = regexp.MustCompile(`(?i)\bDROP\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?([^\s(;]+(?:\s[^\s(;]+)*?)\s*[(;]`)
	funcAction = regexp.MustCompile(`^\{\{\s*\.Func\s+"([a-z0-9_]+)"\s*\}\}$`)
	space      = regexp.MustCompile(`\s+`)
	comment    = regexp.MustCompile(`--[^\n]*`)
)

// displayName is the function's name as a reader finds it in the database: the table's derived
// objects are <table>_suffix (in the table's schema).
func displayName(name string) string {
	if m := funcAction.FindStringSubmatch(name); m != nil {
		return "<table>_" + m[1]
	}
	if name == "{{.NotifyFunc}}" {
		return "<table>_notify"
	}
	return name
}

// argsAt returns the argument list that opens at text[open] ('('), whitespace collapsed.
func argsAt(text string, open int) string {
	depth := 0
	for i := open; i < len(text); i++ {
		switch text[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return space.ReplaceAllString(strings.TrimSpace(text[open+1:i]), " ")
			}
		}
	}
	return "?"
}

// definitions returns every function's definitions and drops, in migration order.
func definitions(t *testing.T) map[string][]definition {
	t.Helper()
	entries, err := fs.ReadDir(FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names) // NNNNN_ prefixes: the name order is the version order
	defs := map[string][]definition{}
	for _, name := range names {
		raw, err := FS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		// Comments are blanked (same length, so offsets and lines hold) before matching.
		text := comment.ReplaceAllStringFunc(string(raw), func(c string) string { return strings.Repeat(" ", len(c)) })
		lineOf := func(off int) int { return 1 + strings.Count(text[:off], "\n") }
		for _, m := range createFunc.FindAllStringSubmatchIndex(text, -1) {
			fn := displayName(text[m[2]:m[3]])
			defs[fn] = append(defs[fn], definition{file: name, line: lineOf(m[0]), args: argsAt(text, m[1]-1)})
		}
		for _, m := range dropFunc.FindAllStringSubmatchIndex(text, -1) {
			fn := displayName(text[m[2]:m[3]])
			defs[fn] = append(defs[fn], definition{file: name, line: lineOf(m[0]), drop: true})
		}
		if n, found := len(regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\b`).FindAllStringIndex(text, -1)),
			len(createFunc.FindAllStringIndex(text, -1)); n != found {
			t.Errorf("%s: %d CREATE FUNCTION statements, %d of them understood (name, then an argument list)", name, n, found)
		}
	}
	for fn, ds := range defs {
		sort.SliceStable(ds, func(i, j int) bool {
			if ds[i].file != ds[j].file {
				return ds[i].file < ds[j].file
			}
			return ds[i].line < ds[j].line
		})
		defs[fn] = ds
	}
	return defs
}

func link(d definition) string {
	return fmt.Sprintf("[%s:%d](%s#L%d)", d.file, d.line, d.file, d.line)
}

// renderIndex is INDEX.md: for every function, the migration that holds its current definition.
func renderIndex(defs map[string][]definition) []byte {
	fns := make([]string, 0, len(defs))
	for fn := range defs {
		fns = append(fns, fn)
	}
	sort.Strings(fns)
	var b bytes.Buffer
	b.WriteString("# Where each function is defined now\n\n")
	b.WriteString("Generated from the migrations by `go test ./migrations -update`; `go test ./migrations` fails\n")
	b.WriteString("when this file is stale. A migration that changes a function redefines it whole, so its\n")
	b.WriteString("current definition is the last one listed. `<table>` is the outbox table (`<schema>.<name>`):\n")
	b.WriteString("`<table>_pending` of `shop.outbox` is `shop.outbox_pending`.\n\n")
	b.WriteString("| function | current definition | earlier definitions |\n")
	b.WriteString("|---|---|---|\n")
	for _, fn := range fns {
		ds := defs[fn]
		last := ds[len(ds)-1]
		current := link(last)
		sig := fmt.Sprintf("`%s(%s)`", fn, last.args)
		if last.drop {
			current = "dropped in " + link(last)
			sig = "`" + fn + "`"
		}
		var earlier []string
		for _, d := range ds[:len(ds)-1] {
			s := link(d)
			if d.drop {
				s = "dropped in " + s
			}
			earlier = append(earlier, s)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", sig, current, strings.Join(earlier, ", "))
	}
	return b.Bytes()
}

// TestIndex checks that INDEX.md names, for every function the migrations define, the migration
// that defines it last (go test ./migrations -update rewrites it).
func TestIndex(t *testing.T) {
	defs := definitions(t)
	if len(defs) == 0 {
		t.Fatal("no CREATE FUNCTION found in the migrations")
	}
	want := renderIndex(defs)
	if *update {
		if err := os.WriteFile(indexFile, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(indexFile)
	if err != nil {
		t.Fatalf("%v: run go test ./migrations -update", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("migrations/%s is stale: run go test ./migrations -update and commit it; want:\n%s", indexFile, want)
	}
}

// TestParse checks the parser on the shapes the migrations use.
func TestParse(t *testing.T) {
	text := "CREATE FUNCTION {{.Func \"a\"}}(x int,\n    y text) RETURNS void\n" +
		"-- CREATE FUNCTION {{.Func \"commented\"}}() is not a definition\n" +
		"create or replace function {{.NotifyFunc}}() RETURNS trigger\n" +
		"CREATE OR REPLACE FUNCTION public.plain(n numeric(10, 2)) RETURNS void\n" +
		"DROP FUNCTION IF EXISTS {{.Func \"b\"}}(int);\n"
	blank := comment.ReplaceAllStringFunc(text, func(c string) string { return strings.Repeat(" ", len(c)) })
	var got []string
	for _, m := range createFunc.FindAllStringSubmatchIndex(blank, -1) {
		got = append(got, displayName(blank[m[2]:m[3]])+"("+argsAt(blank, m[1]-1)+")")
	}
	for _, m := range dropFunc.FindAllStringSubmatchIndex(blank, -1) {
		got = append(got, "drop "+displayName(blank[m[2]:m[3]]))
	}
	want := []string{"<table>_a(x int, y text)", "<table>_notify()", "public.plain(n numeric(10, 2))", "drop <table>_b"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("parsed %q, want %q", got, want)
	}
}
