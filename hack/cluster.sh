#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, for the end-to-end test: containerd,
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and a CNI
# bridge, all started from here (no systemd, no registry, no downloads besides Debian packages and
# the Go module proxy). Must run as root.
#
#   hack/cluster.sh up                 start it; returns once the node is Ready
#   hack/cluster.sh down               stop it and restore the host (idempotent)
#   hack/cluster.sh status             phase, components, node; exit 0 only when ready
#   hack/cluster.sh kubeconfig         print the admin kubeconfig path
#   hack/cluster.sh env                print KUBECONFIG=..., OUTBOX_NODE_IP=..., for eval
#   hack/cluster.sh load-image TAR...  import docker-archive tarballs (hack/imgtool) into containerd
#   hack/cluster.sh kubectl ARGS...    kubectl with the admin kubeconfig
#   hack/cluster.sh logs               print the directory of the component logs
#
# Pods use images loaded with load-image and `imagePullPolicy: Never`. There is no cluster DNS:
# pods get the host's resolv.conf, so in-cluster names (svc.cluster.local) do not resolve; the API
# server is reachable through KUBERNETES_SERVICE_HOST (10.96.0.1). Services on the host
# (PostgreSQL, Kafka) are reached at the node IP ($OUTBOX_NODE_IP, printed by `env`): they must
# listen on it (or on 0.0.0.0), Kafka must advertise it, and pod traffic arrives from the pod CIDR
# ($OUTBOX_POD_CIDR, 10.244.0.0/24; it is not masqueraded), so pg_hba.conf must admit it.
#
# Images: `go run ./hack/imgtool -o x.tar -t localhost/NAME:TAG -entrypoint /BIN BIN:/BIN`, then
# `hack/cluster.sh load-image x.tar`.
#
# State lives under ${OUTBOX_CLUSTER_DIR:-/tmp/outbox-cluster}, deleted by `down` (set
# OUTBOX_CLUSTER_KEEP_LOGS=DIR to have `down` copy the component logs there first). Binaries are
# built once into ~/.cache/outbox-operator/k8s-<version> by hack/k8s-bins.sh (minutes when cold).
# The components run as children of a supervisor (this script, `_supervise`) under hack/reaper, a
# child subreaper, so that they and containerd's shims are reaped here: the VM's PID 1 does not
# reliably reap orphans. `up` records what it is about to change on the host (sysctls, cgroups,
# nftables tables, a few host paths); `down` stops everything, unmounts, removes the KUBE-*
# iptables chains, the bridge, the new cgroups and paths, restores the sysctls and deletes the
# state directory. Environment: OUTBOX_NODE_IP (default: source address of the default route),
# OUTBOX_CLUSTER_TIMEOUT (300 s), OUTBOX_APISERVER_PORT (6443), OUTBOX_ETCD_PORT (12379).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}
HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HACK/.." && pwd)
STATE=$(realpath -m "${OUTBOX_CLUSTER_DIR:-/tmp/outbox-cluster}")
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-operator
BIN_DIR=${OUTBOX_K8S_BIN_DIR:-$CACHE/k8s-$K8S_VERSION}
NODE_NAME=${OUTBOX_NODE_NAME:-outbox-node}
BRIDGE=${OUTBOX_CLUSTER_BRIDGE:-outbox0}
POD_CIDR=${OUTBOX_POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC_IP=10.96.0.1
APISERVER_PORT=${OUTBOX_APISERVER_PORT:-6443}
ETCD_PORT=${OUTBOX_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
PAUSE_IMAGE=localhost/outbox-pause:dev
UP_TIMEOUT=${OUTBOX_CLUSTER_TIMEOUT:-300}
SOCK=$STATE/containerd/containerd.sock
PKI=$STATE/pki
# Ports the components listen on (besides the API server and etcd), checked before `up`.
FIXED_PORTS=(10248 10250 10249 10256 10257 10259)
PACKAGES=(containerd runc containernetworking-plugins iptables nftables conntrack socat ethtool openssl iproute2 curl)
# Sysctls the components (kubelet, kube-proxy, the CNI bridge plugin) may change; ip_forward
# first, since writing it resets every conf.*.forwarding.
SYSCTLS=(net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv4.conf.default.forwarding
  net.ipv6.conf.all.forwarding net.ipv6.conf.default.forwarding
  net.ipv4.conf.all.route_localnet net.ipv4.conf.default.route_localnet
  kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.netfilter.nf_conntrack_tcp_be_liberal
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)
# Host paths outside the state directory that containerd, its shims, CNI or the kubelet create
# whatever their configuration says; `down` removes those that did not exist before `up`.
HOST_PATHS=(/run/containerd /var/lib/cni /var/log/containers /var/log/pods /var/run/netns
  /var/lib/kubelet /etc/kubernetes /opt/containerd /var/lib/containerd /etc/cni
  /usr/libexec/kubernetes /run/mount "$HOME/.kube")

log() { printf '%s cluster: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'cluster: error: %s\n' "$*" >&2; exit 1; }
need_root() { [[ $(id -u) == 0 ]] || die "must run as root (it starts containerd and a kubelet)"; }
ctr_() { ctr -a "$SOCK" -n k8s.io "$@"; }
kubectl_() { "$BIN_DIR/kubectl" --kubeconfig "$STATE/admin.kubeconfig" --cache-dir "$STATE/kubectl-cache" --request-timeout=10s "$@"; }
phase() { printf '%s\n' "$*" >"$STATE/phase.tmp" && mv -f "$STATE/phase.tmp" "$STATE/phase"; }

# alive PID: the process exists and is not a zombie.
alive() {
  local line rest
  [[ -n ${1:-} ]] || return 1
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  rest=${line##*) }
  [[ ${rest%% *} != Z ]]
}

load_env() {
  [[ -f $STATE/cluster.env ]] || return 1
  # shellcheck source=/dev/null
  source "$STATE/cluster.env"
}

############################################################ preparation (`up`)

ensure_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "installing Debian packages: ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >"$STATE.apt.log" 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update >>"$STATE.apt.log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >>"$STATE.apt.log" 2>&1 ||
      { tail -n 20 "$STATE.apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $STATE.apt.log)"; }
  fi
  rm -f "$STATE.apt.log"
}

detect_node_ip() {
  local ip=${OUTBOX_NODE_IP:-}
  if [[ -z $ip ]]; then
    ip=$(ip -4 -o route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit }}')
  fi
  if [[ -z $ip ]]; then
    ip=$(ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot find the node IP (no default route, no global IPv4 address); set OUTBOX_NODE_IP"
  [[ $ip != 127.* ]] || die "node IP $ip is a loopback address: pods could not reach it; set OUTBOX_NODE_IP"
  ip -4 -o addr show | grep -qF " inet $ip/" || die "node IP $ip is not an address of this host (ip -4 addr)"
  echo "$ip"
}

preflight() {
  local p busy=()
  for p in "$APISERVER_PORT" "$ETCD_PORT" "$ETCD_PEER_PORT" "${FIXED_PORTS[@]}"; do
    [[ -z $(ss -Hltn "sport = :$p" 2>/dev/null) ]] || busy+=("$p")
  done
  ((${#busy[@]} == 0)) || die "TCP ports already in use: ${busy[*]} (another cluster or kubelet running?  ss -ltnp)"
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || die "network interface $BRIDGE already exists (another cluster? hack/cluster.sh down)"
  if iptables -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
    die "iptables chain KUBE-SERVICES exists: another kube-proxy's rules are on this host"
  fi
  [[ -r /proc/sys/net/ipv4/ip_forward ]] || die "/proc/sys is not readable"
}

cgroup_dirs() { find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d 2>/dev/null | sort; }

snapshot_host() {
  local h=$STATE/host k p v
  mkdir -p "$h"
  : >"$h/sysctl"
  for k in "${SYSCTLS[@]}"; do
    p=/proc/sys/${k//.//}
    if [[ -w $p ]] && v=$(cat "$p" 2>/dev/null); then printf '%s=%s\n' "$k" "$v" >>"$h/sysctl"; fi
  done
  : >"$h/paths"
  for p in "${HOST_PATHS[@]}"; do [[ -e $p || -L $p ]] && echo "$p" >>"$h/paths"; done
  cgroup_dirs >"$h/cgroups"
  nft list tables 2>/dev/null | sort >"$h/nft-tables" || true
  iptables-save >"$h/iptables" 2>/dev/null || true
  ip6tables-save >"$h/ip6tables" 2>/dev/null || true
  touch "$h/complete"
}

build_tools() {
  local t=$STATE/tools c=$CACHE/cluster-tools
  mkdir -p "$t" "$c" "$STATE/images"
  log "building hack/reaper, hack/imgtool, hack/pause"
  # Built into the cache (go build skips what is up to date there), run from copies.
  (cd "$REPO" && CGO_ENABLED=0 GOWORK=off go build -mod=readonly -trimpath -ldflags "-s -w" -o "$c/" ./hack/reaper ./hack/imgtool ./hack/pause) ||
    die "go build of hack/reaper, hack/imgtool, hack/pause failed in $REPO"
  cp "$c/reaper" "$c/imgtool" "$c/pause" "$t/"
  "$t/imgtool" -o "$STATE/images/pause.tar" -t "$PAUSE_IMAGE" -entrypoint /pause -user 65535 "$t/pause:/pause" >/dev/null ||
    die "building the pause image failed"
  # The supervisor runs from a copy, so that editing this file cannot break a running cluster.
  cp "${BASH_SOURCE[0]}" "$t/cluster.sh"
}

# cert NAME CN O EXTENSIONS: a key and a certificate signed by the cluster CA.
cert() {
  local name=$1 cn=$2 o=$3 ext=$4 subj
  subj="/CN=$cn"
  [[ -z $o ]] || subj="/O=$o$subj"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/$name.key" \
    -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days 30 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

gen_pki() {
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  local server="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
  mkdir -p "$PKI" && chmod 700 "$PKI"
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$PKI/ca.key" \
    -subj "/CN=outbox-operator-test-ca" -days 30 -sha256 -out "$PKI/ca.crt" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null ||
    die "openssl could not create the CA"
  cert apiserver kube-apiserver "" "$server
subjectAltName=DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$KUBERNETES_SVC_IP,IP:$NODE_IP,IP:127.0.0.1"
  cert apiserver-kubelet kube-apiserver-kubelet-client system:masters "$client"
  cert admin outbox-admin system:masters "$client"
  cert kcm system:kube-controller-manager "" "$client"
  cert sched system:kube-scheduler "" "$client"
  cert kube-proxy system:kube-proxy "" "$client"
  cert kubelet-client "system:node:$NODE_NAME" system:nodes "$client"
  cert kubelet "$NODE_NAME" "" "$server
subjectAltName=DNS:$NODE_NAME,IP:$NODE_IP,IP:127.0.0.1"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
  openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 600 "$PKI"/*.key
}

# kubeconfig FILE CERTNAME: a kubeconfig with embedded credentials.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: outbox
  cluster:
    server: https://$NODE_IP:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: outbox
  context: {cluster: outbox, user: $2, namespace: default}
current-context: outbox
EOF
  chmod 600 "$1"
}

write_configs() {
  mkdir -p "$STATE/config" "$STATE/cni/conf" "$STATE/cni/ipam" "$STATE/containerd" "$STATE/etcd" \
    "$STATE/kubelet" "$STATE/manifests" "$STATE/pod-logs" "$STATE/volume-plugins" "$STATE/logs" "$STATE/run"
  chmod 700 "$STATE/etcd"
  kubeconfig "$STATE/admin.kubeconfig" admin
  kubeconfig "$STATE/kcm.kubeconfig" kcm
  kubeconfig "$STATE/sched.kubeconfig" sched
  kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy
  kubeconfig "$STATE/kubelet.kubeconfig" kubelet-client

  # restrict_oom_score_adj: this VM lacks CAP_SYS_RESOURCE, so runc cannot set -998 for sandboxes.
  # Every path containerd would put under /var/lib, /run or /opt is moved under $STATE, except the
  # shims' sockets (/run/containerd/s, hard-coded) and libcni's cache (/var/lib/cni).
  cat >"$STATE/config/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
oom_score = 0

[grpc]
  address = "$SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  disable_tcp_service = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/conf"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    snapshotter = "overlayfs"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$STATE/containerd/runc"
        SystemdCgroup = false
EOF

  cat >"$STATE/cni/conf/10-outbox-bridge.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "outbox-pods",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}
    }
  ]
}
EOF

  # cgroup v1 here: failCgroupV1 false, cgroupfs. No clusterDNS: there is no DNS server, so pods
  # get the host's resolv.conf instead of a nameserver that never answers.
  cat >"$STATE/config/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
healthzBindAddress: 127.0.0.1
healthzPort: 10248
port: 10250
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$SOCK
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
staticPodPath: $STATE/manifests
podLogsDir: $STATE/pod-logs
volumePluginDir: $STATE/volume-plugins
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podCIDR: $POD_CIDR
cgroupsPerQOS: true
enforceNodeAllocatable: []
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: true
registerNode: true
rotateCertificates: false
serverTLSBootstrap: false
EOF

  # Conntrack limits and timeouts 0: leave the host's as they are. No NodePorts on localhost:
  # no route_localnet.
  cat >"$STATE/config/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [primary]
iptables: {localhostNodePorts: false}
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF

  cat >"$STATE/cluster.env" <<EOF
NODE_IP=$NODE_IP
NODE_NAME=$NODE_NAME
BIN_DIR=$BIN_DIR
BRIDGE=$BRIDGE
POD_CIDR=$POD_CIDR
APISERVER_PORT=$APISERVER_PORT
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
EOF
}

cmd_up() {
  need_root
  local start=$SECONDS
  if [[ -d $STATE ]]; then
    if load_env && [[ $(cat "$STATE/phase" 2>/dev/null) == ready ]] && alive "$(cat "$STATE/run/reaper.pid" 2>/dev/null)"; then
      log "already up (state $STATE)"
      return 0
    fi
    log "found leftovers of an earlier cluster in $STATE; tearing them down first"
    cmd_down
  fi
  ensure_packages
  BIN_DIR=$("$HACK/k8s-bins.sh" "$BIN_DIR") || die "hack/k8s-bins.sh failed"
  NODE_IP=$(detect_node_ip)
  preflight
  mkdir -p "$STATE"
  snapshot_host
  # From here on the host is being changed: a failed `up` tears down what it started.
  trap 'st=$?; if ((st)) && [[ -d $STATE ]]; then log "up failed; tearing down"; cmd_down || true; fi; exit "$st"' EXIT
  build_tools
  gen_pki
  write_configs
  phase starting

  log "starting the supervisor (node $NODE_NAME, IP $NODE_IP, logs in $STATE/logs)"
  # fd 9 is the lock of this script; the supervisor must not inherit it.
  "$STATE/tools/reaper" -setsid -grace 15s -- "$STATE/tools/cluster.sh" _supervise \
    </dev/null >>"$STATE/logs/supervisor.log" 2>&1 9>&- &
  echo $! >"$STATE/run/reaper.pid"
  local pid=$! p f started=$SECONDS
  while :; do
    p=$(cat "$STATE/phase" 2>/dev/null || true)
    case $p in
    ready) break ;;
    failed:*)
      f=$(cat "$STATE/failed-component" 2>/dev/null || true)
      if [[ -n $f && -f $STATE/logs/$f.log ]]; then
        log "last lines of $f.log:"
        tail -n 20 "$STATE/logs/$f.log" >&2 || true
      fi
      die "cluster did not come up: ${p#failed: }"
      ;;
    esac
    if ! alive "$pid"; then
      tail -n 15 "$STATE/logs/supervisor.log" >&2 || true
      die "the supervisor exited during startup (phase: $p)"
    fi
    if ((SECONDS - started > UP_TIMEOUT)); then
      tail -n 15 "$STATE/logs/supervisor.log" >&2 || true
      die "node not Ready ${UP_TIMEOUT}s after the start of the components (phase: $p); OUTBOX_CLUSTER_KEEP_LOGS=DIR keeps the logs"
    fi
    sleep 0.5
  done
  trap - EXIT
  log "node $NODE_NAME Ready in $((SECONDS - start)) s ($((SECONDS - started)) s after the start of the components); KUBECONFIG=$STATE/admin.kubeconfig, node IP $NODE_IP"
}

############################################################ supervisor (`_supervise`)

declare -A PIDS=()
STOP=0

start_component() {
  local name=$1
  shift
  log "starting $name"
  "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null &
  PIDS[$name]=$!
  echo $! >"$STATE/run/$name.pid"
}

stop_component() {
  local name=$1 timeout=${2:-15} pid i t0=$SECONDS
  pid=${PIDS[$name]:-}
  [[ -n $pid ]] || return 0
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 5; i++)); do
      alive "$pid" || break
      sleep 0.2
    done
    if alive "$pid"; then
      log "$name did not stop within ${timeout}s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  rm -f "$STATE/run/$name.pid"
  unset 'PIDS[$name]'
  log "stopped $name ($((SECONDS - t0)) s)"
}

# remove_containers: kill and delete every task (the shims exit with their last task), then the
# containers. The kubelet is stopped by then, so nothing restarts them.
remove_containers() {
  alive "${PIDS[containerd]:-}" || return 0
  local t c i err tasks
  tasks=$(ctr_ tasks ls -q 2>/dev/null) || return 0
  for t in $tasks; do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  for t in $tasks; do
    for ((i = 0; i < 10; i++)); do
      err=$(ctr_ tasks rm -f "$t" 2>&1 >/dev/null) && break
      [[ $err == *"not found"* ]] && break
      sleep 0.2
    done
    ((i < 10)) || log "could not remove containerd task $t: $err"
  done
  for c in $(ctr_ containers ls -q 2>/dev/null); do
    ctr_ containers rm "$c" >/dev/null 2>&1 || true
  done
}

shutdown_all() {
  phase stopping
  log "stopping the cluster"
  stop_component kube-controller-manager 10
  stop_component kube-scheduler 10
  stop_component kubelet 15
  stop_component kube-proxy 10
  remove_containers
  stop_component containerd 15
  stop_component kube-apiserver 15
  stop_component etcd 15
  phase stopped
  log "stopped"
}

fail() {
  log "FAILED: $*"
  phase "failed: $*"
  shutdown_all
  phase "failed: $*"
  exit 1
}

# wait_until NAME TIMEOUT WHAT CMD...: poll CMD until it succeeds; fail with the reason if NAME
# died or TIMEOUT seconds passed.
wait_until() {
  local name=$1 timeout=$2 what=$3 start=$SECONDS
  shift 3
  while :; do
    ((STOP == 0)) || { shutdown_all; exit 0; }
    if ! alive "${PIDS[$name]:-}"; then
      local st=0
      wait "${PIDS[$name]}" 2>/dev/null || st=$?
      echo "$name" >"$STATE/failed-component"
      fail "$name exited (status $st) before $what; last log line: $(tail -n 1 "$STATE/logs/$name.log" 2>/dev/null | cut -c1-400)"
    fi
    if "$@" >/dev/null 2>&1; then return 0; fi
    ((SECONDS - start < timeout)) || {
      echo "$name" >"$STATE/failed-component"
      fail "$name: no $what after ${timeout}s; last log line: $(tail -n 1 "$STATE/logs/$name.log" 2>/dev/null | cut -c1-400)"
    }
    sleep 0.5
  done
}

curl_ca() { curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }
node_ready() {
  [[ $(kubectl_ get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
sa_ready() { kubectl_ -n default get serviceaccount default && kubectl_ -n default get configmap kube-root-ca.crt; }

supervise() {
  load_env || { echo "no $STATE/cluster.env" >&2; exit 1; }
  trap 'STOP=1' TERM INT HUP
  cd "$STATE"
  local B=$BIN_DIR P=$PKI s=$SECONDS

  start_component containerd containerd --config "$STATE/config/containerd.toml"
  wait_until containerd 30 "API on $SOCK" ctr -a "$SOCK" version
  ctr_ images import "$STATE/images/pause.tar" >/dev/null 2>>"$STATE/logs/containerd.log" ||
    fail "ctr images import of the pause image failed (see logs/containerd.log)"

  start_component etcd "$B/etcd" --name default --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync=true
  wait_until etcd 30 "health on 127.0.0.1:$ETCD_PORT" curl -fsS --max-time 3 "http://127.0.0.1:$ETCD_PORT/health"

  start_component kube-apiserver "$B/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address="$NODE_IP" --secure-port="$APISERVER_PORT" --advertise-address="$NODE_IP" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --allow-privileged=true --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$P/apiserver-kubelet.crt" --kubelet-client-key="$P/apiserver-kubelet.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP --profiling=false
  # The kubelet initialises for seconds before it needs the API server, and retries until it
  # answers: start it now. The controller manager and kube-proxy want a serving API server.
  start_component kubelet "$B/kubelet" --config="$STATE/config/kubelet.yaml" --kubeconfig="$STATE/kubelet.kubeconfig" \
    --root-dir="$STATE/kubelet" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
  wait_until kube-apiserver 90 "/readyz on $NODE_IP:$APISERVER_PORT" curl_ca "https://$NODE_IP:$APISERVER_PORT/readyz"

  start_component kube-controller-manager "$B/kube-controller-manager" --kubeconfig="$STATE/kcm.kubeconfig" \
    --authentication-kubeconfig="$STATE/kcm.kubeconfig" --authorization-kubeconfig="$STATE/kcm.kubeconfig" \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --use-service-account-credentials=true \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=10257 --profiling=false
  start_component kube-scheduler "$B/kube-scheduler" --kubeconfig="$STATE/sched.kubeconfig" \
    --authentication-kubeconfig="$STATE/sched.kubeconfig" --authorization-kubeconfig="$STATE/sched.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259 --profiling=false
  start_component kube-proxy "$B/kube-proxy" --config="$STATE/config/kube-proxy.yaml"

  wait_until kube-controller-manager 60 "healthz on 127.0.0.1:10257" curl -fsSk --max-time 3 https://127.0.0.1:10257/healthz
  wait_until kube-scheduler 60 "healthz on 127.0.0.1:10259" curl -fsSk --max-time 3 https://127.0.0.1:10259/healthz
  wait_until kubelet 60 "healthz on 127.0.0.1:10248" curl -fsS --max-time 3 http://127.0.0.1:10248/healthz
  wait_until kubelet 120 "Ready node $NODE_NAME" node_ready
  wait_until kube-proxy 60 "healthz on 127.0.0.1:10256" curl -fsS --max-time 3 http://127.0.0.1:10256/healthz
  wait_until kube-controller-manager 60 "default ServiceAccount and kube-root-ca.crt" sa_ready
  phase ready
  log "ready after $((SECONDS - s)) s"

  local pid name st
  while ((STOP == 0)); do
    pid='' st=0
    wait -n -p pid || st=$?
    ((STOP == 0)) || break
    if [[ -z $pid ]]; then
      ((${#PIDS[@]})) || { log "no component left running"; break; }
      sleep 1
      continue
    fi
    for name in "${!PIDS[@]}"; do
      if [[ ${PIDS[$name]} == "$pid" ]]; then
        log "$name exited unexpectedly (status $st); see $STATE/logs/$name.log"
        phase "failed: $name exited unexpectedly (status $st)"
        unset 'PIDS[$name]'
      fi
    done
  done
  shutdown_all
}

############################################################ teardown (`down`)

# stop_supervisor: TERM the reaper (it forwards to the supervisor, which stops the components in
# order and reaps them), then wait for it; as a fallback kill what is left.
stop_supervisor() {
  local pid i
  pid=$(cat "$STATE/run/reaper.pid" 2>/dev/null || true)
  if alive "$pid" && grep -qa "$STATE/tools/reaper" "/proc/$pid/cmdline" 2>/dev/null; then
    log "stopping the components"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 600; i++)); do
      alive "$pid" || break
      sleep 0.2
    done
    if alive "$pid"; then
      log "the supervisor did not stop within 120 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  kill_leftovers
}

# kill_leftovers: our components and containerd's shims (their command lines name the state
# directory), should the supervisor have died before stopping them.
kill_leftovers() {
  local p pids=() i comm
  while read -r p comm; do
    case $comm in
    containerd | containerd-shim* | etcd | kube-apiserver | kube-controller | kube-scheduler | kubelet | kube-proxy | reaper | bash) ;;
    *) continue ;;
    esac
    [[ $p != "$$" && $p != "$BASHPID" ]] || continue
    alive "$p" || continue
    if [[ $comm == bash ]]; then
      tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$STATE/tools/cluster.sh _supervise" || continue
    fi
    if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$STATE/"; then pids+=("$p"); fi
  done < <(ps -eo pid=,comm=)
  ((${#pids[@]})) || return 0
  log "killing leftover processes: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 25; i++)); do
    local any=0
    for p in "${pids[@]}"; do alive "$p" && any=1; done
    ((any)) || return 0
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

mounts_under_state() { awk -v s="$STATE" '$2 == s || index($2, s "/") == 1 { print $2 }' /proc/self/mounts | sort -r; }

unmount_state() {
  local m i
  for ((i = 0; i < 5; i++)); do
    [[ -n $(mounts_under_state) ]] || return 0
    while read -r m; do
      m=$(printf '%b' "$m") # /proc/mounts escapes spaces as \040
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(mounts_under_state)
  done
  [[ -z $(mounts_under_state) ]]
}

# remove_kube_chains: drop the KUBE-* chains and every rule that jumps to one, in every table,
# keeping everything else (iptables-save, filter, iptables-restore of that table only).
remove_kube_chains() {
  local ipt t saved
  for ipt in iptables ip6tables; do
    command -v "$ipt-save" >/dev/null || continue
    for t in filter nat mangle raw; do
      saved=$("$ipt-save" -t "$t" 2>/dev/null) || continue
      grep -q 'KUBE-' <<<"$saved" || continue
      grep -v -e '^:KUBE-' -e '^-A KUBE-' -e '-j KUBE-' -e '-g KUBE-' <<<"$saved" | "$ipt-restore" -T "$t" ||
        log "warning: could not remove the KUBE-* chains of $ipt table $t"
    done
  done
}

# remove_new_nft_tables: tables that did not exist before `up` and hold no rule any more
# (iptables-nft leaves empty tables and base chains behind).
remove_new_nft_tables() {
  local before=$STATE/host/nft-tables fam name
  [[ -f $before ]] || return 0
  while read -r _ fam name; do
    [[ -n $name ]] || continue
    grep -qxF "table $fam $name" "$before" && continue
    if [[ $name == kube-proxy ]] || ! nft list table "$fam" "$name" 2>/dev/null | grep -qvE '^\s*(table|chain|type|policy|\}|$)'; then
      nft delete table "$fam" "$name" 2>/dev/null || log "warning: could not delete nftables table $fam $name"
    fi
  done < <(nft list tables 2>/dev/null)
}

remove_new_cgroups() {
  local before=$STATE/host/cgroups d p
  [[ -f $before ]] || return 0
  while read -r d; do
    grep -qxF "$d" "$before" && continue
    # Kill anything still inside (containers whose shim died), then remove bottom-up.
    while read -r p; do kill -KILL "$p" 2>/dev/null || true; done < <(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    if [[ -d $d ]]; then
      sleep 0.5
      find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || log "warning: could not remove cgroup $d"
    fi
  done < <(cgroup_dirs)
}

restore_sysctls() {
  local f=$STATE/host/sysctl k v
  [[ -f $f ]] || return 0
  while IFS='=' read -r k v; do
    [[ -n $k ]] || continue
    [[ $(cat "/proc/sys/${k//.//}" 2>/dev/null) == "$v" ]] && continue
    printf '%s\n' "$v" >"/proc/sys/${k//.//}" 2>/dev/null || log "warning: could not restore sysctl $k=$v"
  done <"$f"
}

remove_new_paths() {
  local f=$STATE/host/paths p
  [[ -f $STATE/host/complete ]] || return 0
  for p in "${HOST_PATHS[@]}"; do
    grep -qxF "$p" "$f" && continue
    [[ -e $p || -L $p ]] || continue
    if awk -v s="$p" '$2 == s || index($2, s "/") == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
      log "warning: $p has mounts; not removing it"
      continue
    fi
    rm -rf --one-file-system "$p" && log "removed $p (created while the cluster ran)"
  done
}

cmd_down() {
  need_root
  local start=$SECONDS problems=() iface
  if [[ ! -d $STATE ]]; then
    log "no cluster state at $STATE; nothing to do"
    return 0
  fi
  load_env || true
  stop_supervisor
  unmount_state || problems+=("mounts left under $STATE: $(mounts_under_state | tr '\n' ' ')")
  if [[ -x ${BIN_DIR:-}/kube-proxy ]]; then "$BIN_DIR/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  remove_kube_chains
  remove_new_nft_tables
  # The pods' veths go with their network namespaces (unmounted above); delete stragglers, then the bridge.
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    for iface in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link del "$iface" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || problems+=("could not delete interface $BRIDGE")
  fi
  remove_new_cgroups
  restore_sysctls
  remove_new_paths
  if [[ -n ${OUTBOX_CLUSTER_KEEP_LOGS:-} && -d $STATE/logs ]]; then
    mkdir -p "$OUTBOX_CLUSTER_KEEP_LOGS" && cp -r "$STATE/logs/." "$OUTBOX_CLUSTER_KEEP_LOGS/" &&
      log "component logs copied to $OUTBOX_CLUSTER_KEEP_LOGS"
  fi
  if ((${#problems[@]})); then
    log "state kept in $STATE for another \`down\`: ${problems[*]}"
    return 1
  fi
  rm -rf --one-file-system "$STATE"
  log "down in $((SECONDS - start)) s; host restored"
}

############################################################ other commands

cmd_status() {
  if ! load_env; then
    echo "cluster: down (no state in $STATE)"
    return 1
  fi
  local p name pid ok=0
  p=$(cat "$STATE/phase" 2>/dev/null || echo unknown)
  echo "phase:      $p"
  echo "state:      $STATE"
  echo "kubeconfig: $STATE/admin.kubeconfig"
  echo "node:       $NODE_NAME ($NODE_IP)"
  for name in reaper containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    pid=$(cat "$STATE/run/$name.pid" 2>/dev/null || true)
    if alive "$pid"; then printf '  %-24s running (pid %s)\n' "$name" "$pid"; else printf '  %-24s not running\n' "$name"; ok=1; fi
  done
  [[ $p == ready ]] || ok=1
  if ((ok == 0)); then kubectl_ get nodes -o wide 2>&1 || ok=1; fi
  return "$ok"
}

cmd_load_image() {
  (($#)) || die "usage: $0 load-image TAR..."
  load_env || die "cluster is not up (no state in $STATE)"
  [[ -S $SOCK ]] || die "containerd socket $SOCK missing; is the cluster up?"
  local t
  for t in "$@"; do
    [[ -f $t ]] || die "no such file: $t"
    ctr_ images import "$t" || die "ctr images import $t failed"
  done
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
  up | down)
    need_root
    # One up/down at a time; fd 9 (the lock) is closed for the supervisor.
    exec 9<"${BASH_SOURCE[0]}"
    flock -w 600 9 || die "another hack/cluster.sh up/down is running"
    "cmd_$cmd"
    ;;
  status) cmd_status ;;
  kubeconfig)
    load_env || die "cluster is not up (no state in $STATE)"
    echo "$STATE/admin.kubeconfig"
    ;;
  env)
    load_env || die "cluster is not up (no state in $STATE)"
    printf 'export KUBECONFIG=%q\nexport KUBECACHEDIR=%q\nexport OUTBOX_NODE_IP=%q\nexport OUTBOX_POD_CIDR=%q\nexport OUTBOX_CLUSTER_DIR=%q\nexport OUTBOX_CONTAINERD_SOCK=%q\nexport OUTBOX_KUBECTL=%q\n' \
      "$STATE/admin.kubeconfig" "$STATE/kubectl-cache" "$NODE_IP" "$POD_CIDR" "$STATE" "$SOCK" "$BIN_DIR/kubectl"
    ;;
  load-image) cmd_load_image "$@" ;;
  kubectl)
    load_env || die "cluster is not up (no state in $STATE)"
    exec "$BIN_DIR/kubectl" --kubeconfig "$STATE/admin.kubeconfig" --cache-dir "$STATE/kubectl-cache" "$@"
    ;;
  logs)
    [[ -d $STATE/logs ]] || die "no logs in $STATE"
    echo "$STATE/logs"
    ;;
  _supervise) supervise ;;
  *)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
  esac
}

main "$@"
