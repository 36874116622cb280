#!/usr/bin/env bash
# Smoke test of hack/cluster.sh, run by hand as root (takes about a minute once the binaries are
# built):
#   1. records the host (iptables, nftables, sysctls, mounts, links, cgroups, processes);
#   2. hack/cluster.sh up;
#   3. builds a static Go probe, packs it with hack/imgtool (USER 65532), loads it;
#   4. serves a marker file with python3 -m http.server on the node IP;
#   5. runs a 1-replica Deployment (imagePullPolicy Never, runAsNonRoot, read-only root) whose pod
#      is Ready only after it fetched the marker from the host through the node IP and read
#      /version from the API server through the kubernetes Service (10.96.0.1, kube-proxy);
#      checks `kubectl logs` and `kubectl exec`;
#   6. hack/cluster.sh down, and checks that the host is as recorded in 1.
# Exit status 0 when everything passed. Timings are printed at the end.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HACK/.." && pwd)
STATE=$(realpath -m "${OUTBOX_CLUSTER_DIR:-/tmp/outbox-cluster}")
PORT=${SMOKE_HTTP_PORT:-18080}
CLUSTER=$HACK/cluster.sh
IMAGE=localhost/outbox-smoke:dev

log() { printf '%s smoke: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'smoke: FAIL: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root"
[[ ! -d $STATE ]] || die "$STATE exists: a cluster is up (hack/cluster.sh down first)"

work=$(mktemp -d /tmp/outbox-smoke.XXXXXX)
http_pid=
cluster_started=0
cleanup() {
  local st=$?
  if [[ -n $http_pid ]]; then kill "$http_pid" 2>/dev/null || true; wait "$http_pid" 2>/dev/null || true; fi
  if ((cluster_started)) && [[ -d $STATE ]]; then
    log "cleaning up after a failure: hack/cluster.sh down"
    "$CLUSTER" down || true
  fi
  rm -rf "$work"
  exit "$st"
}
trap cleanup EXIT

# Sysctls that change by themselves.
volatile='^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(random\.|ns_last_pid|pty\.nr|sched_domain)|net\.netfilter\.nf_conntrack_count|net\.ipv4\.tcp_mem|net\.ipv4\.udp_mem|net\.ipv4\.route\.gc|fs\.binfmt_misc)'
snapshot() {
  local d=$1
  mkdir -p "$d"
  iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$d/iptables" || true
  ip6tables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$d/ip6tables" || true
  nft list ruleset >"$d/nft" 2>/dev/null || true
  sysctl -a 2>/dev/null | grep -Ev "$volatile" | sort >"$d/sysctl"
  awk '{print $2, $3}' /proc/self/mounts | sort >"$d/mounts"
  ip -o link show | awk -F': ' '{print $2}' | sort >"$d/links"
  find /sys/fs/cgroup -mindepth 1 -maxdepth 3 -type d 2>/dev/null | sort >"$d/cgroups"
  for p in /run/containerd /var/lib/cni /var/log/containers /var/log/pods /var/run/netns /var/lib/kubelet \
    /etc/kubernetes /opt/containerd /var/lib/containerd /etc/cni /usr/libexec/kubernetes; do
    [[ -e $p ]] && echo "$p"
  done >"$d/paths"
  # Ours: anything naming the state directory, and what only a node runs (envtest, which other
  # tests may start meanwhile, runs etcd and kube-apiserver too).
  ps -eo stat=,comm=,args= | awk -v s="$STATE/" '$1 !~ /^Z/ && (index($0, s) || $2 ~ /^(containerd|containerd-shim.*|kubelet|kube-proxy|reaper|pause|probe)$/) {print $2}' |
    sort >"$d/procs" || true
  ps -eo stat= | awk '/^Z/ {n++} END {print n + 0}' >"$d/zombies"
}

snapshot "$work/before"

node_ip_guess=$(ip -4 -o route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit }}')
[[ -z $(ss -Hltn "sport = :$PORT") ]] || die "port $PORT is in use; set SMOKE_HTTP_PORT"

# --- 2. up
t0=$SECONDS
cluster_started=1
"$CLUSTER" up
t_up=$((SECONDS - t0))
eval "$("$CLUSTER" env)"
[[ $OUTBOX_NODE_IP == "${OUTBOX_NODE_IP_EXPECT:-$node_ip_guess}" ]] || log "note: node IP $OUTBOX_NODE_IP (route source $node_ip_guess)"
K=("$CLUSTER" kubectl)

# --- 3. the probe image
mkdir -p "$work/probe"
cat >"$work/probe/go.mod" <<'EOF'
module smoke/probe

go 1.26
EOF
cat >"$work/probe/main.go" <<'EOF'
// probe: `probe get URL` prints the body; otherwise fetch $TARGET_URL (a service on the host) and
// the API server's /version (in-cluster credentials), then serve /healthz on :8080.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func get(c *http.Client, url, token string) (string, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(b)), err
}

func retry(what string, f func() (string, error)) string {
	for i := 0; ; i++ {
		s, err := f()
		if err == nil {
			return s
		}
		if i == 60 {
			fmt.Println("FAIL", what, err)
			os.Exit(1)
		}
		fmt.Println("retry", what, err)
		time.Sleep(time.Second)
	}
}

func main() {
	plain := &http.Client{Timeout: 5 * time.Second}
	if len(os.Args) == 3 && os.Args[1] == "get" {
		s, err := get(plain, os.Args[2], "")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(s)
		return
	}
	body := retry("host service", func() (string, error) { return get(plain, os.Getenv("TARGET_URL"), "") })
	fmt.Println("host service answered:", body)

	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	token, err := os.ReadFile(sa + "token")
	if err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
	caPEM, err := os.ReadFile(sa + "ca.crt")
	if err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	api := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	ver := retry("apiserver", func() (string, error) { return get(api, "https://"+host+"/version", string(token)) })
	fmt.Println("apiserver via", host, "answered:", strings.Join(strings.Fields(ver), " "))

	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	fmt.Println("serving :8080")
	if err := http.ListenAndServe(":8080", nil); err != nil {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
}
EOF
log "building the probe and its image"
(cd "$work/probe" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/probe/probe" .)
(cd "$REPO" && go run -mod=readonly ./hack/imgtool -o "$work/probe.tar" -t "$IMAGE" -entrypoint /probe "$work/probe/probe:/probe")
"$CLUSTER" load-image "$work/probe.tar"

# --- 4. a service on the host, on the node IP
mkdir -p "$work/www"
marker="smoke-$RANDOM$RANDOM"
echo "$marker" >"$work/www/marker"
python3 -m http.server "$PORT" --bind "$OUTBOX_NODE_IP" --directory "$work/www" >"$work/http.log" 2>&1 &
http_pid=$!
for _ in $(seq 50); do curl -fsS "http://$OUTBOX_NODE_IP:$PORT/marker" >/dev/null 2>&1 && break; sleep 0.2; done
curl -fsS "http://$OUTBOX_NODE_IP:$PORT/marker" >/dev/null || die "python3 http.server did not start on $OUTBOX_NODE_IP:$PORT"

# --- 5. the Deployment
t1=$SECONDS
"${K[@]}" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: smoke, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: smoke}}
  template:
    metadata: {labels: {app: smoke}}
    spec:
      terminationGracePeriodSeconds: 2
      securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: probe
        image: $IMAGE
        imagePullPolicy: Never
        env: [{name: TARGET_URL, value: "http://$OUTBOX_NODE_IP:$PORT/marker"}]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
EOF
if ! "${K[@]}" rollout status deployment/smoke --timeout=120s; then
  "${K[@]}" describe pods -l app=smoke >&2 || true
  "${K[@]}" logs deployment/smoke >&2 || true
  die "the Deployment did not become available"
fi
t_ready=$((SECONDS - t1))
logs=$("${K[@]}" logs deployment/smoke)
printf '%s\n' "$logs" | sed 's/^/  pod log: /' >&2
grep -qF "host service answered: $marker" <<<"$logs" || die "the pod did not fetch the marker from $OUTBOX_NODE_IP:$PORT"
grep -q 'apiserver via 10.96.0.1:443 answered: .*"gitVersion": "v' <<<"$logs" || die "the pod did not reach the API server through 10.96.0.1"
got=$("${K[@]}" exec deployment/smoke -- /probe get "http://$OUTBOX_NODE_IP:$PORT/marker")
[[ $got == "$marker" ]] || die "kubectl exec: got '$got', want '$marker'"
log "pod reached the host service on $OUTBOX_NODE_IP:$PORT and the API server; logs and exec work"
kill "$http_pid" 2>/dev/null || true
wait "$http_pid" 2>/dev/null || true
http_pid=

# --- 6. down, and the host as before
t2=$SECONDS
"$CLUSTER" down
t_down=$((SECONDS - t2))
cluster_started=0
sleep 1
snapshot "$work/after"
bad=0
for f in iptables ip6tables nft sysctl mounts links cgroups paths procs; do
  if ! diff -u "$work/before/$f" "$work/after/$f" >"$work/$f.diff"; then
    log "host differs after down: $f"
    sed 's/^/    /' "$work/$f.diff" >&2
    bad=1
  fi
done
[[ ! -e $STATE ]] || { log "$STATE still exists"; bad=1; }
zb=$(cat "$work/before/zombies") za=$(cat "$work/after/zombies")
log "zombie processes: $zb before, $za after (at most one, the reaper, left to PID 1, may remain for a while)"
if ((za > zb + 1)); then log "more than one new zombie"; bad=1; fi
((bad == 0)) || die "the host was not restored"
log "PASS: up ${t_up}s, Deployment Ready ${t_ready}s, down ${t_down}s; host restored"
