// Package image checks the image build the README names (make docker-build: the Dockerfile)
// where no Docker engine runs: its build context, as .dockerignore filters it, must hold every
// file the Dockerfile copies, and what it copies must hold every package the binaries it builds
// import. (The tests build the image another way, hack/build-image.sh, so they would not notice.)
package image

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const root = "../.."

// dockerignore is the build context's filter: Docker's rules for the patterns used here (the
// last pattern that matches a path or one of its parent directories decides; ! re-includes).
type dockerignore []struct {
	pattern string
	include bool
}

func readDockerignore(t *testing.T) dockerignore {
	t.Helper()
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerignore
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		include := strings.HasPrefix(line, "!")
		p := strings.TrimSuffix(strings.TrimPrefix(line, "!"), "/")
		d = append(d, struct {
			pattern string
			include bool
		}{filepath.Clean(p), include})
	}
	return d
}

// includes reports whether path (relative to the context, slash-separated) is in the context.
func (d dockerignore) includes(path string) bool {
	in := true
	parts := strings.Split(path, "/")
	for _, p := range d {
		for i := 1; i <= len(parts); i++ {
			if ok, _ := filepath.Match(p.pattern, strings.Join(parts[:i], "/")); ok {
				in = p.include
				break
			}
		}
	}
	return in
}

// copies returns the sources of the Dockerfile's COPY instructions from the build context.
func copies(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var srcs []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "COPY" || strings.HasPrefix(f[1], "--from") {
			continue
		}
		for _, s := range f[1 : len(f)-1] {
			srcs = append(srcs, strings.TrimSuffix(s, "/"))
		}
	}
	return srcs
}

// TestBuildContextHoldsWhatTheDockerfileCopies: every file under every COPY source is in the
// context (the defect this catches: .dockerignore once allowed migrations/ after it was renamed,
// and never outboxdb/, so COPY outboxdb/ found nothing).
func TestBuildContextHoldsWhatTheDockerfileCopies(t *testing.T) {
	d := readDockerignore(t)
	srcs := copies(t)
	if len(srcs) < 5 {
		t.Fatalf("COPY sources %v: the Dockerfile was not read", srcs)
	}
	for _, src := range srcs {
		files := 0
		err := filepath.WalkDir(filepath.Join(root, src), func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(rel)
			if !d.includes(rel) {
				t.Errorf("COPY %s: %s is left out of the build context by .dockerignore", src, rel)
			}
			files++
			return nil
		})
		if err != nil {
			t.Errorf("COPY %s: %v", src, err)
		}
		if files == 0 {
			t.Errorf("COPY %s copies nothing", src)
		}
	}
}

// TestCopiesHoldTheBinariesImports: every package of this module the three binaries import lies
// under a COPY source, so the build finds it.
func TestCopiesHoldTheBinariesImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}",
		"../../cmd/manager", "../../cmd/relay", "../../cmd/kubectl-outbox").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	srcs := copies(t)
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(abs, dir)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		found := false
		for _, s := range srcs {
			if rel == s || strings.HasPrefix(rel, s+"/") {
				found = true
			}
		}
		if !found {
			t.Errorf("package directory %s is imported by the binaries but no COPY brings it", rel)
		}
	}
}
