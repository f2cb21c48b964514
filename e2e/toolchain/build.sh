#!/usr/bin/env bash
# Builds the pinned control-plane binaries from official Go modules into a
# per-version cache directory, and prints that directory.
#
# Where it sits: called by the Makefile (`make toolchain`, `make demo`, `make
# cluster`, and so `.ci/run` and `make test`) and by the harness
# (e2e/cluster/layout.py, e2e/realnode/node.py, tests/conftest.py), each
# asking for the parts it needs. Versions come from versions.env only. A
# binary that is already in the cache is never rebuilt, so a warm run prints
# nothing and takes milliseconds.
#
#   e2e/toolchain/build.sh               every part but real-nodes (the test tiers)
#   e2e/toolchain/build.sh PART...       only these parts:
#       control-plane  etcd, kube-apiserver, -controller-manager, -scheduler, kwok
#                      (the local control plane: all `make demo` needs)
#       tools          helm, kwokctl (`make cluster` puts them on PATH; chart tests)
#       kube-router    the NetworkPolicy enforcer (tenancy tests)
#       autoscaler     cluster-autoscaler and its test cloud (autoscaler test)
#       kueue          Kueue and its CRDs (Kueue test)
#       real-nodes     kubelet, pause, CoreDNS, the registry, Debian's
#                      containerd/runc/CNI and the images' base root filesystem
#   e2e/toolchain/build.sh --real-nodes  every part, real-nodes included
#   e2e/toolchain/build.sh --print       print the bin dir, build nothing
#
# Progress: one line per step that builds, on stderr: what it is, step k of n,
# the time so far (since $TORCHFLEX_BUILD_T0, which the Makefile sets, else
# since this script started). What the steps print (`go: downloading`, the
# compiler, apt) goes to a log file under the cache's logs/; a failed step's
# message names that file and shows its last lines.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${TORCHFLEX_CACHE:-$HOME/.cache/torchflex}"
go_version="$(go env GOVERSION)"
bin_dir="$cache_root/bin/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_${go_version}"

all_parts=(control-plane tools kube-router autoscaler kueue)
parts=()
for arg in "$@"; do
  case "$arg" in
    --print) echo "$bin_dir"; exit 0 ;;
    --real-nodes) parts+=("${all_parts[@]}" real-nodes) ;;
    control-plane | tools | kube-router | autoscaler | kueue | real-nodes) parts+=("$arg") ;;
    *) echo "build.sh: unknown part '$arg' (parts: ${all_parts[*]} real-nodes)" >&2; exit 2 ;;
  esac
done
(( ${#parts[@]} )) || parts=("${all_parts[@]}")
has_part() { [[ " ${parts[*]} " == *" $1 "* ]]; }

mkdir -p "$bin_dir"
# Inside a step: its own lines go to the step's log, beside the Go chatter.
log() { echo "[toolchain] $*" >&2; }

# Keep Go's own caches under ~/.cache so CI's second run is warm.
export GOMODCACHE="${GOMODCACHE:-$HOME/.cache/torchflex/gomod}"
export GOCACHE="${GOCACHE:-$HOME/.cache/torchflex/gobuild}"
export GOFLAGS="-trimpath"
export CGO_ENABLED=0

k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
# Version stamping, so `kubectl version` and helm see a real server version.
k8s_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${k8s_minor} \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION} \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=${k8s_minor}"

# Each output has a ready_* test (is it in the cache?) that plans the run, and a
# build_* function that makes it; build_* runs inside a step (its output in the log).
ready_bin() { [[ -x "$bin_dir/$1" ]]; }

build_k8s() {
  local name="$1"
  log "building $name ${KUBERNETES_VERSION}"
  (cd "$here/k8s" && go build -ldflags "$k8s_ldflags" -o "$bin_dir/$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$bin_dir/$name.tmp" "$bin_dir/$name"
}

build_etcd() {
  log "building etcd ${ETCD_VERSION}"
  (cd "$here/etcd" && go build -ldflags "-s -w" -o "$bin_dir/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
}

# The NetworkPolicy enforcer of the tenancy e2e test: kube-router, whose firewall
# the harness runs alone (e2e/cluster/enforcer.py). Its go.mod has no replace
# directives, so `go install pkg@version` builds the release as published; the
# version is in the file name, so a bump builds anew without changing the
# directory every other binary lives in. The version stamp is what its own
# Makefile sets (kube-router logs it at start).
build_kube_router() {
  local out="$bin_dir/kube-router-${KUBE_ROUTER_VERSION}"
  log "building kube-router ${KUBE_ROUTER_VERSION}"
  local tmp
  tmp="$(mktemp -d "$bin_dir/.kube-router-build.XXXXXX")"
  GOBIN="$tmp" go install \
    -ldflags "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=${KUBE_ROUTER_VERSION}" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@${KUBE_ROUTER_VERSION}"
  mv "$tmp/kube-router" "$out"
  rmdir "$tmp"
}

# Kueue: cmd/kueue from the wrapper module in kueue/ (its go.sum pins the release's
# hashes), and the release's CRDs beside the binary for the harness to apply.
kueue_out="$bin_dir/kueue-${KUEUE_VERSION}"
ready_kueue() { [[ -x "$kueue_out" && -d "$kueue_out-crds" ]]; }
build_kueue() {
  local out="$kueue_out" crds="$kueue_out-crds"
  grep -Eq "sigs.k8s.io/kueue ${KUEUE_VERSION}( // indirect)?\$" "$here/kueue/go.mod" \
    || { log "kueue/go.mod does not pin kueue ${KUEUE_VERSION}"; return 1; }
  log "building kueue ${KUEUE_VERSION}"
  (cd "$here/kueue" && go build -ldflags "-s -w" -o "$out.tmp" sigs.k8s.io/kueue/cmd/kueue)
  local src
  src="$(cd "$here/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  rm -rf "$crds.tmp" && mkdir -p "$crds.tmp"
  cp "$src"/config/components/crd/bases/*.yaml "$crds.tmp/"
  chmod u+w "$crds.tmp"/*.yaml
  rm -rf "$crds" && mv "$crds.tmp" "$crds"
  mv "$out.tmp" "$out"
}

# cluster-autoscaler (externalgrpc cloud provider only) and the test cloud's gRPC
# bridge (autoscaler/testcloud, our code: its file name carries the hash of its
# source, so an edit builds anew). The wrapper module in autoscaler/ copies the
# replace directives of cluster-autoscaler's go.mod; its go.sum pins the hashes
# the checksum database lacks (the autoscaler's pseudo-versions are not in it).
autoscaler_out="$bin_dir/cluster-autoscaler-${CLUSTER_AUTOSCALER_VERSION}"
testcloud_hash="$(cat "$here/autoscaler/go.mod" "$here/autoscaler/go.sum" "$here/autoscaler/testcloud/main.go" | sha256sum | cut -c1-12)"
testcloud_out="$bin_dir/autoscaler-testcloud-$testcloud_hash"
ready_autoscaler() { [[ -x "$autoscaler_out" ]]; }
build_autoscaler() {
  grep -q "k8s.io/autoscaler/cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION}\$" "$here/autoscaler/go.mod" \
    || { log "autoscaler/go.mod does not pin cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION}"; return 1; }
  log "building cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION}"
  (cd "$here/autoscaler" && go build -tags externalgrpc -ldflags "-s -w" -o "$autoscaler_out.tmp" \
    k8s.io/autoscaler/cluster-autoscaler)
  mv "$autoscaler_out.tmp" "$autoscaler_out"
}
ready_testcloud() { [[ -x "$testcloud_out" ]]; }
build_testcloud() {
  log "building the autoscaler test cloud ($testcloud_hash)"
  (cd "$here/autoscaler" && go build -ldflags "-s -w" -o "$testcloud_out.tmp" ./testcloud)
  mv "$testcloud_out.tmp" "$testcloud_out"
}

# kwok and helm have no replace directives, so `go install pkg@version` works.
kwok_flags="-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}"
build_kwok() {
  log "building $1 from sigs.k8s.io/kwok/cmd/$1@${KWOK_VERSION}"
  GOBIN="$bin_dir" go install -ldflags "-s -w $kwok_flags" "sigs.k8s.io/kwok/cmd/$1@${KWOK_VERSION}"
}

# helm's own Makefile stamps the Kubernetes version its client-go speaks
# (client-go v0.N -> v1.N) into chartutil and the lint rules; without it a
# `go install` build defaults to v1.20.0 and refuses any chart whose
# kubeVersion asks for more. The stamp file (the flags it was built with)
# makes a helm built without these flags (an older cache) rebuild once; the
# flags follow from HELM_VERSION alone, which names the bin dir.
helm_stamp="$bin_dir/.helm-ldflags"
ready_helm() {
  [[ -x "$bin_dir/helm" ]] && grep -q "internal/version.version=${HELM_VERSION} .*lint/rules.k8sVersionMinor=" "$helm_stamp" 2>/dev/null
}
build_helm() {
  local mod client_go major minor flags
  mod="$(cd / && go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$mod")"
  [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || { log "no client-go version in $mod"; return 1; }
  major=1 minor="${BASH_REMATCH[1]}"
  flags="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  log "building helm ${HELM_VERSION} (Kubernetes v$major.$minor)"
  local tmp
  tmp="$(mktemp -d "$bin_dir/.helm-build.XXXXXX")"
  GOBIN="$tmp" go install -ldflags "-s -w $flags" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  # A rename: tests using the previous binary meanwhile never see half a file.
  mv "$tmp/helm" "$bin_dir/helm"
  rmdir "$tmp"
  echo "$flags" > "$helm_stamp"
}

# The plan: the steps of the asked parts whose output is not in the cache yet,
# each "function|argument|what it is" (a background step's function starts "&").
plan=()
want() {
  local ready="$1" build="$2" what="$3" arg="${4:-}"
  "$ready" "$arg" || plan+=("$build|$arg|$what")
}
if has_part real-nodes; then
  # shellcheck source=realnode.sh
  source "$here/realnode.sh"
  # apt and mmdebstrap wait on the network while the Go builds use the CPUs:
  # that chain runs beside them (cold, it is minutes of either), so it starts first.
  want ready_debian "&build_debian" "installing Debian's containerd, runc, CNI plugins and buildah, then the images' base root filesystem (beside the builds)"
fi
if has_part control-plane; then
  want ready_bin build_etcd "etcd ${ETCD_VERSION}" etcd
  for name in kube-apiserver kube-controller-manager kube-scheduler; do
    want ready_bin build_k8s "$name ${KUBERNETES_VERSION}" "$name"
  done
  want ready_bin build_kwok "kwok ${KWOK_VERSION}" kwok
fi
if has_part tools; then
  want ready_bin build_kwok "kwokctl ${KWOK_VERSION}" kwokctl
  want ready_helm build_helm "helm ${HELM_VERSION}"
fi
has_part kube-router && want ready_bin build_kube_router "kube-router ${KUBE_ROUTER_VERSION}" "kube-router-${KUBE_ROUTER_VERSION}"
if has_part autoscaler; then
  want ready_autoscaler build_autoscaler "cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION} (the longest build: ~10 min on 2 cores)"
  want ready_testcloud build_testcloud "the autoscaler's test cloud ($testcloud_hash)"
fi
has_part kueue && want ready_kueue build_kueue "kueue ${KUEUE_VERSION}"
if has_part real-nodes; then
  want ready_bin build_k8s "kubelet ${KUBERNETES_VERSION}" kubelet
  want ready_pause build_pause "pause ${PAUSE_VERSION}"
  want ready_coredns build_coredns "coredns ${COREDNS_VERSION}"
  want ready_registry build_registry "registry ${DISTRIBUTION_VERSION}"
fi

# Warm: nothing to say.
if (( ${#plan[@]} == 0 )); then
  echo "$bin_dir"
  exit 0
fi

# shellcheck source=../../scripts/progress.sh
progress_prefix=toolchain
source "$here/../../scripts/progress.sh"
progress_n=${#plan[@]}
build_log="$(progress_log_file toolchain)"
background_log="${build_log%.log}-background.log"
echo "[toolchain] $progress_n steps to build (${parts[*]}) into $bin_dir; their output: $build_log" >&2

background_pid="" background_k=0 background_what=""
k=0
for step in "${plan[@]}"; do
  k=$(( k + 1 ))
  IFS='|' read -r fn arg what <<< "$step"
  if [[ "$fn" == "&"* ]]; then
    progress_line "$k" "$what"
    ( set -e; "${fn#&}" ) > "$background_log" 2>&1 &
    background_pid=$! background_k=$k background_what="$what"
    continue
  fi
  # shellcheck disable=SC2086  # no argument when arg is empty
  progress_step "$k" "building $what" "$build_log" "$fn" $arg
done
if [[ -n "$background_pid" ]]; then
  wait "$background_pid" || progress_failed "$background_k" "$background_what" "$background_log"
fi
echo "[toolchain] built in $(progress_since)" >&2
echo "$bin_dir"
