#!/usr/bin/env bash
# Builds the pinned control-plane binaries from official Go modules into a
# per-version cache directory, and prints that directory.
#
# Where it sits: called by `make toolchain` (and so by `.ci/run`, `make
# cluster`, `make test`). Versions come from versions.env only. A binary that
# is already in the cache is never rebuilt, so a warm run takes milliseconds.
#
#   e2e/toolchain/build.sh               build what is missing, print the bin dir
#   e2e/toolchain/build.sh --print       print the bin dir, build nothing
#   e2e/toolchain/build.sh --real-nodes  also the real-node flavor's parts
#                                        (kubelet, pause, Debian containerd/runc/CNI,
#                                        the local registry, the images' base rootfs);
#                                        `make test`, `make test-real-nodes` and
#                                        `make demo NODES=real` ask for them
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${TORCHFLEX_CACHE:-$HOME/.cache/torchflex}"
go_version="$(go env GOVERSION)"
bin_dir="$cache_root/bin/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_${go_version}"

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir"
  exit 0
fi
real_nodes=0
[[ "${1:-}" == "--real-nodes" ]] && real_nodes=1

mkdir -p "$bin_dir"
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

build_k8s() {
  local name="$1"
  [[ -x "$bin_dir/$name" ]] && return 0
  log "building $name ${KUBERNETES_VERSION} (cold: many minutes on 2 cores)"
  (cd "$here/k8s" && go build -ldflags "$k8s_ldflags" -o "$bin_dir/$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$bin_dir/$name.tmp" "$bin_dir/$name"
}

build_etcd() {
  [[ -x "$bin_dir/etcd" ]] && return 0
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
  [[ -x "$out" ]] && return 0
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
build_kueue() {
  local out="$bin_dir/kueue-${KUEUE_VERSION}" crds="$bin_dir/kueue-${KUEUE_VERSION}-crds"
  [[ -x "$out" && -d "$crds" ]] && return 0
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
build_autoscaler() {
  local out="$bin_dir/cluster-autoscaler-${CLUSTER_AUTOSCALER_VERSION}" src_hash cloud
  src_hash="$(cat "$here/autoscaler/go.mod" "$here/autoscaler/go.sum" "$here/autoscaler/testcloud/main.go" | sha256sum | cut -c1-12)"
  cloud="$bin_dir/autoscaler-testcloud-$src_hash"
  [[ -x "$out" && -x "$cloud" ]] && return 0
  grep -q "k8s.io/autoscaler/cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION}\$" "$here/autoscaler/go.mod" \
    || { log "autoscaler/go.mod does not pin cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION}"; return 1; }
  if [[ ! -x "$out" ]]; then
    log "building cluster-autoscaler ${CLUSTER_AUTOSCALER_VERSION} (cold: ~10 minutes on 2 cores)"
    (cd "$here/autoscaler" && go build -tags externalgrpc -ldflags "-s -w" -o "$out.tmp" \
      k8s.io/autoscaler/cluster-autoscaler)
    mv "$out.tmp" "$out"
  fi
  log "building the autoscaler test cloud ($src_hash)"
  (cd "$here/autoscaler" && go build -ldflags "-s -w" -o "$cloud.tmp" ./testcloud)
  mv "$cloud.tmp" "$cloud"
}

# kwok and helm have no replace directives, so `go install pkg@version` works.
go_install() {
  local name="$1" pkg="$2"
  [[ -x "$bin_dir/$name" ]] && return 0
  log "building $name from $pkg"
  GOBIN="$bin_dir" go install -ldflags "-s -w ${3:-}" "$pkg"
}

# helm's own Makefile stamps the Kubernetes version its client-go speaks
# (client-go v0.N -> v1.N) into chartutil and the lint rules; without it a
# `go install` build defaults to v1.20.0 and refuses any chart whose
# kubeVersion asks for more. The stamp file makes a helm built without these
# flags (an older cache) rebuild once.
build_helm() {
  local mod client_go major minor flags stamp="$bin_dir/.helm-ldflags"
  mod="$(cd / && go mod download -json "helm.sh/helm/v3@${HELM_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$mod")"
  [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || { log "no client-go version in $mod"; return 1; }
  major=1 minor="${BASH_REMATCH[1]}"
  flags="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
  flags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  flags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  if [[ -x "$bin_dir/helm" && "$(cat "$stamp" 2>/dev/null)" == "$flags" ]]; then
    return 0
  fi
  log "building helm ${HELM_VERSION} (Kubernetes v$major.$minor)"
  local tmp
  tmp="$(mktemp -d "$bin_dir/.helm-build.XXXXXX")"
  GOBIN="$tmp" go install -ldflags "-s -w $flags" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  # A rename: tests using the previous binary meanwhile never see half a file.
  mv "$tmp/helm" "$bin_dir/helm"
  rmdir "$tmp"
  echo "$flags" > "$stamp"
}

build_etcd
build_k8s kube-apiserver
build_k8s kube-controller-manager
build_k8s kube-scheduler
go_install kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}"
go_install kwokctl "sigs.k8s.io/kwok/cmd/kwokctl@${KWOK_VERSION}" "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION}"
build_helm
build_kube_router
build_autoscaler
build_kueue
if (( real_nodes )); then
  # shellcheck source=realnode.sh
  source "$here/realnode.sh"
  # apt and mmdebstrap wait on the network while the Go builds use the CPUs:
  # run that chain beside them (cold, it is minutes of either).
  (install_node_packages && build_base_rootfs) &
  packages_pid=$!
  build_k8s kubelet
  build_pause
  build_coredns
  build_registry
  wait "$packages_pid" || { log "Debian packages or the base root filesystem failed"; exit 1; }
fi

echo "$bin_dir"
