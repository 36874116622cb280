// Command imgtool builds a single-layer container image from scratch, holding the given files,
// and writes it as a docker-archive tarball that `ctr images import` (hack/cluster.sh load-image)
// accepts. There is no image registry and no Docker engine on the test machines; the images
// only carry static Go binaries.
//
//	imgtool -o out.tar -t localhost/outbox-operator:dev [-entrypoint /manager] [-user 65532]
//	        [-env K=V]... [-workdir /] SRC:DST[:MODE]...
//
// Each SRC:DST copies the host file SRC to the absolute path DST in the image, owned by root,
// with MODE (octal, default 0755). Parent directories are created (0755), /tmp (1777) is added,
// and /etc/passwd and /etc/group gain the entries root (0) and nonroot (65532) unless a file
// is placed there. -entrypoint takes a path, or a JSON array for an entrypoint with arguments.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// fileSpec is one SRC:DST[:MODE] argument.
type fileSpec struct {
	src, dst string
	mode     int64
}

// epoch is the modification time of every entry, so the same inputs give the same image digest.
var epoch = time.Unix(0, 0).UTC()

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "imgtool:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("imgtool", flag.ContinueOnError)
	out := fs.String("o", "", "output docker-archive tarball (required)")
	ref := fs.String("t", "", "image reference, e.g. localhost/outbox-operator:dev (required)")
	entrypoint := fs.String("entrypoint", "", "entrypoint: a path, or a JSON array of strings")
	user := fs.String("user", "65532", "USER of the image (uid or uid:gid)")
	workdir := fs.String("workdir", "/", "working directory")
	platform := fs.String("platform", "linux/"+runtime.GOARCH, "os/arch of the image")
	var envs, cmd listFlag
	fs.Var(&envs, "env", "environment variable K=V (repeatable)")
	fs.Var(&cmd, "cmd", "CMD argument (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: imgtool -o OUT.tar -t REF [flags] SRC:DST[:MODE]...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *ref == "" {
		fs.Usage()
		return errors.New("-o and -t are required")
	}
	tag, err := name.NewTag(*ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", *ref, err)
	}
	osArch := strings.SplitN(*platform, "/", 2)
	if len(osArch) != 2 || osArch[0] == "" || osArch[1] == "" {
		return fmt.Errorf("-platform %q: want os/arch", *platform)
	}
	var ep []string
	switch {
	case strings.HasPrefix(strings.TrimSpace(*entrypoint), "["):
		if err := json.Unmarshal([]byte(*entrypoint), &ep); err != nil {
			return fmt.Errorf("-entrypoint %q: %w", *entrypoint, err)
		}
	case *entrypoint != "":
		ep = []string{*entrypoint}
	}
	for _, e := range envs {
		if !strings.Contains(e, "=") {
			return fmt.Errorf("-env %q: want K=V", e)
		}
	}
	var files []fileSpec
	for _, a := range fs.Args() {
		f, err := parseSpec(a)
		if err != nil {
			return err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return errors.New("no files given (SRC:DST[:MODE])")
	}

	layerTar, err := buildLayer(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = osArch[0], osArch[1]
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	env = append(env, envs...)
	cf.Config = v1.Config{
		Entrypoint: ep,
		Cmd:        cmd,
		Env:        env,
		User:       *user,
		WorkingDir: *workdir,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if err := tarball.WriteToFile(*out, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, tag.Name(), digest)
	return nil
}

func parseSpec(a string) (fileSpec, error) {
	parts := strings.Split(a, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
		return fileSpec{}, fmt.Errorf("file %q: want SRC:DST[:MODE]", a)
	}
	f := fileSpec{src: parts[0], dst: path.Clean(parts[1]), mode: 0o755}
	if !path.IsAbs(f.dst) || f.dst == "/" {
		return fileSpec{}, fmt.Errorf("file %q: DST must be an absolute file path", a)
	}
	if len(parts) == 3 {
		m, err := strconv.ParseInt(parts[2], 8, 32)
		if err != nil || m < 0 || m > 0o7777 {
			return fileSpec{}, fmt.Errorf("file %q: MODE must be octal, e.g. 0644", a)
		}
		f.mode = m
	}
	st, err := os.Stat(f.src)
	if err != nil {
		return fileSpec{}, fmt.Errorf("file %q: %w", a, err)
	}
	if !st.Mode().IsRegular() {
		return fileSpec{}, fmt.Errorf("file %q: %s is not a regular file", a, f.src)
	}
	return f, nil
}

// buildLayer returns an uncompressed tar with the directories, the files and the defaults.
func buildLayer(files []fileSpec) ([]byte, error) {
	dirs := map[string]int64{"/tmp": 0o1777, "/etc": 0o755}
	placed := map[string]bool{}
	for _, f := range files {
		if placed[f.dst] {
			return nil, fmt.Errorf("%s is given twice", f.dst)
		}
		placed[f.dst] = true
		for d := path.Dir(f.dst); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for _, f := range files {
		if _, ok := dirs[f.dst]; ok {
			return nil, fmt.Errorf("%s is both a file and a directory", f.dst)
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirNames := make([]string, 0, len(dirs))
	for d := range dirs {
		dirNames = append(dirNames, d)
	}
	sort.Strings(dirNames) // parents sort before their children
	for _, d := range dirNames {
		h := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: dirs[d], ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	defaults := map[string]string{
		"/etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"/etc/group":  "root:x:0:\nnonroot:x:65532:\n",
	}
	for _, p := range []string{"/etc/group", "/etc/passwd"} {
		if placed[p] {
			continue
		}
		if err := writeFile(tw, p, 0o644, int64(len(defaults[p])), strings.NewReader(defaults[p])); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := copyFile(tw, f); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func copyFile(tw *tar.Writer, f fileSpec) error {
	in, err := os.Open(f.src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := writeFile(tw, f.dst, f.mode, st.Size(), in); err != nil {
		return fmt.Errorf("%s: %w", f.src, err)
	}
	return nil
}

func writeFile(tw *tar.Writer, dst string, mode, size int64, r io.Reader) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: mode, Size: size, ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.Copy(tw, r)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s changed while being read", dst)
	}
	return nil
}
