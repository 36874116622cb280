// Package project checks that PROJECT, the kubebuilder CLI's record of how the project was
// scaffolded, matches the tree: the CLI, run in a copy of the project, must write only where the
// project keeps such files.
package project

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const root = "../.."

// kubebuilderBin is the path of kubebuilder, built by hack/kubebuilder.sh (make setup).
func kubebuilderBin(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join(root, "hack/kubebuilder.sh")).Output()
	if err != nil {
		t.Fatalf("hack/kubebuilder.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// snapshot returns every regular file under dir with its contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// copyTree copies the files kubebuilder reads or writes: PROJECT, go.mod (the repo), config/,
// api/, controllers/, cmd/, hack/boilerplate.go.txt, the Makefile and the Dockerfile.
func copyTree(t *testing.T, dst string) {
	t.Helper()
	for _, p := range []string{"PROJECT", "go.mod", "Makefile", "Dockerfile", "hack/boilerplate.go.txt", "config", "api", "controllers", "cmd"} {
		cmd := exec.Command("cp", "-a", "--parents", p, dst)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("copying %s: %v: %s", p, err, out)
		}
	}
}

// TestKubebuilderWritesWhereTheProjectKeepsFiles: PROJECT declares the kustomize plugin alone, as
// the tree is: the Go code keeps the design's layout (api/, controllers/, cmd/manager/), which no
// kubebuilder Go plugin writes (go/v4, the layout PROJECT used to declare, wants
// internal/controller/ and cmd/main.go, and its create api fails here for want of the latter), so
// new types and controllers are written by hand and controller-gen makes the manifests (make
// manifests). Run in a copy, the CLI reads PROJECT, succeeds, writes nothing outside config/, and
// writes PROJECT back as it is (the file is what the CLI itself writes).
func TestKubebuilderWritesWhereTheProjectKeepsFiles(t *testing.T) {
	kb := kubebuilderBin(t)
	dir, err := filepath.Abs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	copyTree(t, dir)
	before := snapshot(t, dir)
	cmd := exec.Command(kb, "create", "api", "--group", "outbox", "--version", "v1alpha1", "--kind", "Probe")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	t.Logf("kubebuilder create api:\n%s", out)
	if err != nil {
		t.Fatalf("kubebuilder create api: %v", err)
	}
	after := snapshot(t, dir)
	for p, c := range after {
		b, ok := before[p]
		switch {
		case p == "PROJECT" && c != b:
			t.Errorf("the CLI rewrote PROJECT:\n%s\nwas:\n%s", c, b)
		case p != "PROJECT" && !strings.HasPrefix(p, "config/") && (!ok || b != c):
			t.Errorf("kubebuilder wrote %s, outside config/", p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("kubebuilder removed %s", p)
		}
	}
}
