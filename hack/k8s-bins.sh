#!/usr/bin/env bash
# Build the binaries of a single-node Kubernetes cluster (hack/cluster.sh) from source through the
# Go module proxy only: no release downloads, no registry.
#   usage: hack/k8s-bins.sh [OUTDIR]     (default ~/.cache/outbox-operator/k8s-$K8S_VERSION)
# Prints OUTDIR, which then holds kubelet, kube-scheduler, kube-proxy (built here) and
# kube-apiserver, kube-controller-manager, kubectl, etcd (symlinks into the envtest cache that
# hack/envtest-assets.sh fills, built by it first if missing). Idempotent: a `.versions` stamp
# and the binaries existing make it a no-op. Cold on 2 cores: several minutes, ~2.7 GB memory,
# a few GiB of Go build cache (shared with envtest-assets.sh, so whichever runs second is faster).
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.37.2}   # k8s.io/kubernetes v1.X.Y  <->  k8s.io/* staging v0.X.Y
ETCD_VERSION=${ETCD_VERSION:-3.6.16} # must match hack/envtest-assets.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-operator
out=${1:-$cache/k8s-$K8S_VERSION}
envtest_dir=${ENVTEST_ASSETS_DIR:-$cache/envtest-$K8S_VERSION}

mkdir -p "$out" && out=$(cd "$out" && pwd)
built=(kubelet kube-scheduler kube-proxy)
linked=(kube-apiserver kube-controller-manager kubectl etcd)
stamp="k8s=v$K8S_VERSION etcd=v$ETCD_VERSION"

complete() {
  local b
  for b in "${built[@]}" "${linked[@]}"; do [[ -x "$1/$b" ]] || return 1; done
  [[ "$(cat "$1/.versions" 2>/dev/null)" == "$stamp" ]]
}
if complete "$out"; then echo "$out"; exit 0; fi

exec 9>"$out/.lock"
if ! flock -n 9; then
  echo "k8s-bins: another build into $out is running; waiting for it" >&2
  flock 9
fi
if complete "$out"; then echo "$out"; exit 0; fi
rm -f "$out/.versions"

# 1. The control plane shared with envtest: reuse that cache, building it if needed.
envtest_stamp="k8s=v$K8S_VERSION etcd=v$ETCD_VERSION"
envtest_ok=1
for b in "${linked[@]}"; do [[ -x "$envtest_dir/$b" ]] || envtest_ok=0; done
[[ "$(cat "$envtest_dir/.versions" 2>/dev/null)" == "$envtest_stamp" ]] || envtest_ok=0
if [[ $envtest_ok == 0 ]]; then
  if pgrep -f "envtest-assets.sh $envtest_dir" >/dev/null 2>&1; then
    echo "k8s-bins: hack/envtest-assets.sh is already building $envtest_dir; waiting for it" >&2
    while pgrep -f "envtest-assets.sh $envtest_dir" >/dev/null 2>&1; do sleep 10; done
  else
    echo "k8s-bins: building the envtest control plane into $envtest_dir (hack/envtest-assets.sh)" >&2
    K8S_VERSION=$K8S_VERSION ETCD_VERSION=$ETCD_VERSION "$here/envtest-assets.sh" "$envtest_dir" >/dev/null
  fi
  for b in "${linked[@]}"; do
    [[ -x "$envtest_dir/$b" ]] || { echo "k8s-bins: $envtest_dir/$b is missing after hack/envtest-assets.sh" >&2; exit 1; }
  done
  [[ "$(cat "$envtest_dir/.versions" 2>/dev/null)" == "$envtest_stamp" ]] ||
    { echo "k8s-bins: $envtest_dir/.versions is not '$envtest_stamp'" >&2; exit 1; }
fi
for b in "${linked[@]}"; do ln -sfn "$envtest_dir/$b" "$out/$b"; done

# 2. The node binaries.
missing=()
for b in "${built[@]}"; do [[ -x "$out/$b" ]] || missing+=("k8s.io/kubernetes/cmd/$b"); done
if ((${#missing[@]})); then
  export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
  work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
  sv=v0.${K8S_VERSION#*.}            # 1.37.2 -> v0.37.2
  # k8s.io/kubernetes requires its staging repos at v0.0.0 and replaces them with ./staging/...,
  # which a dependent module cannot use, so point each one at its published v0.X.Y. The same list
  # (and the same -trimpath/-ldflags) as hack/envtest-assets.sh, so both share the build cache.
  # Regenerate on a version bump:
  #   grep -E '^\s+k8s.io/\S+ v0.0.0$' "$(go mod download -json k8s.io/kubernetes@v$K8S_VERSION | jq -r .GoMod)"
  staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
    cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
    cri-client cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt
    kms kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
    mount-utils pod-security-admission sample-apiserver streaming)
  {
    printf 'module outboxoperator/k8sbins\n\ngo 1.26.0\n\ngodebug default=go1.26\n\n'
    printf 'require k8s.io/kubernetes v%s\n\ntool (\n' "$K8S_VERSION"
    printf '\t%s\n' "${missing[@]}"
    printf ')\n\nreplace (\n'
    for m in "${staging[@]}"; do printf '\tk8s.io/%s => k8s.io/%s %s\n' "$m" "$m" "$sv"; done
    printf ')\n'
  } >"$work/go.mod"

  ldf="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=${K8S_VERSION%%.*}"
    ldf+=" -X $p.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION") -X $p.gitTreeState=clean"
  done
  echo "k8s-bins: building ${missing[*]##*/} v$K8S_VERSION into $out" >&2
  start=$SECONDS
  (cd "$work" && go mod tidy && go build -trimpath -ldflags "$ldf" -o "$work/bin/" "${missing[@]}") >&2
  for p in "${missing[@]}"; do mv -f "$work/bin/${p##*/}" "$out/${p##*/}"; done
  echo "k8s-bins: built in $((SECONDS - start)) s" >&2
fi

for b in "${built[@]}" "${linked[@]}"; do
  [[ -x "$out/$b" ]] || { echo "k8s-bins: $out/$b is missing" >&2; exit 1; }
done
echo "$stamp" >"$out/.versions"
echo "$out"
