# The real-node flavor's parts beside the control plane (issue 16): the pause
# binary from Kubernetes' own pause.c, containerd/runc/CNI plugins, mmdebstrap
# and buildah from Debian at the versions pinned in versions.env, the local
# registry from its Go module and the images' base root filesystem.
#
# Where it sits: sourced by build.sh only for its real-nodes part (so `make
# toolchain` costs what it did), after build.sh has set here/bin_dir/log and
# sourced versions.env. The kubelet itself is build.sh's build_k8s, from the
# same pinned k8s.io/kubernetes module as the API server. As there, each
# output has a ready_* test (build.sh plans with it) and a build_* function.

# pause.c ships in the k8s.io/kubernetes module zip (build/pause/linux); built
# static as upstream's Makefile does, so the image needs nothing but the file.
ready_pause() { [[ -x "$bin_dir/pause-${PAUSE_VERSION}" ]]; }
build_pause() {
  local out="$bin_dir/pause-${PAUSE_VERSION}"
  local src
  src="$(cd "$here/k8s" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  [[ -f "$src" ]] || (cd "$here/k8s" && go mod download k8s.io/kubernetes)
  log "building pause ${PAUSE_VERSION} from $src"
  gcc -Os -Wall -Werror -static -DVERSION="v${PAUSE_VERSION}-${KUBERNETES_VERSION}" -o "$out.tmp" "$src"
  strip "$out.tmp"
  mv "$out.tmp" "$out"
}

# CoreDNS from its Go module, through coredns/main.go: only the plugins the
# cluster DNS uses (no forward, no cloud providers); go.mod there pins the
# same version as versions.env, checked here so the two cannot drift. A
# stamp of main.go and go.mod rebuilds it when the plugin set changes.
coredns_src() { cat "$here/coredns/main.go" "$here/coredns/go.mod" | sha256sum; }
ready_coredns() {
  [[ -x "$bin_dir/coredns-${COREDNS_VERSION}" \
    && "$(cat "$bin_dir/.coredns-${COREDNS_VERSION}-src" 2>/dev/null)" == "$(coredns_src)" ]]
}
build_coredns() {
  local out="$bin_dir/coredns-${COREDNS_VERSION}" stamp src
  stamp="$bin_dir/.coredns-${COREDNS_VERSION}-src"
  src="$(coredns_src)"
  grep -q "github.com/coredns/coredns ${COREDNS_VERSION}\$" "$here/coredns/go.mod" \
    || { log "coredns/go.mod does not pin coredns ${COREDNS_VERSION}"; return 1; }
  log "building coredns ${COREDNS_VERSION} (bind, ready, errors, log, kubernetes)"
  (cd "$here/coredns" && go build -ldflags "-s -w" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  echo "$src" > "$stamp"
}

# Debian's packages at the pinned versions; apt is a no-op when they are
# there. policy-rc.d on this machine keeps apt from starting the daemons: the
# harness starts its own containerd on its own socket.
missing_node_packages() {  # prints pkg=version of each one not installed at its pin
  local want=(
    "containerd=${CONTAINERD_DEB_VERSION}"
    "runc=${RUNC_DEB_VERSION}"
    "containernetworking-plugins=${CNI_PLUGINS_DEB_VERSION}"
    "busybox-static=${BUSYBOX_DEB_VERSION}"
    "mmdebstrap=${MMDEBSTRAP_DEB_VERSION}"
    "buildah=${BUILDAH_DEB_VERSION}"
  )
  local pkg
  for pkg in "${want[@]}"; do
    [[ "$(dpkg-query -W -f '${Version}' "${pkg%%=*}" 2>/dev/null)" == "${pkg#*=}" ]] || echo "$pkg"
  done
}
install_node_packages() {
  local missing=() pkg
  mapfile -t missing < <(missing_node_packages)
  (( ${#missing[@]} )) || return 0
  # A fresh machine (CI) may have no package lists, or lists older than a pin:
  # refresh them only then. `apt-cache show pkg=ver` exits 0 even for a
  # version it lacks, so read madison's version column instead.
  for pkg in "${missing[@]}"; do
    if ! apt-cache madison "${pkg%%=*}" 2>/dev/null \
        | awk -F ' [|] ' -v want="${pkg#*=}" '$2 == want { found = 1 } END { exit !found }'; then
      log "refreshing apt's package lists (no ${pkg} in them)"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      break
    fi
  done
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
}

# The CNCF distribution registry from its Go module: the local registry on
# loopback that the real node pulls the project's images from.
ready_registry() { [[ -x "$bin_dir/registry-${DISTRIBUTION_VERSION}" ]]; }
build_registry() {
  local out="$bin_dir/registry-${DISTRIBUTION_VERSION}"
  log "building registry ${DISTRIBUTION_VERSION} from github.com/distribution/distribution/v3"
  local tmp
  tmp="$(mktemp -d "$bin_dir/.registry-build.XXXXXX")"
  GOBIN="$tmp" go install -ldflags "-s -w" \
    "github.com/distribution/distribution/v3/cmd/registry@${DISTRIBUTION_VERSION}"
  mv "$tmp/registry" "$out"
  rmdir "$tmp"
}

# The images' base, in place of python:3.11-slim (no registry to pull it
# from): mmdebstrap's "essential" bookworm (no apt, no init) plus Debian's
# python3.11, its venv module and the `python` name the Dockerfiles call,
# and libstdc++6 (torch needs it; slim has it as apt's dependency); docs, man
# pages and locales left out. A root filesystem tarball; the
# harness turns it into an image in the slot's own buildah storage.
base_rootfs_out="$bin_dir/base-python3.11_${LIBSTDCXX_DEB_VERSION//[^A-Za-z0-9._-]/-}_${PYTHON_DEB_VERSION//[^A-Za-z0-9._-]/-}.tar"
build_base_rootfs() {
  local out="$base_rootfs_out"
  [[ -s "$out" ]] && return 0
  log "building the python3.11 base root filesystem with mmdebstrap"
  local exclude=() d
  for d in doc man locale info; do exclude+=("--dpkgopt=path-exclude=/usr/share/$d/*"); done
  # stdin closed: mmdebstrap reads sources from a stdin that is not a tty.
  SOURCE_DATE_EPOCH=0 mmdebstrap --quiet --variant=essential --format=tar \
    --include="python3.11=${PYTHON_DEB_VERSION},python3.11-venv=${PYTHON_DEB_VERSION},python-is-python3,ca-certificates,libstdc++6=${LIBSTDCXX_DEB_VERSION}" \
    "${exclude[@]}" bookworm "$out.tmp" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main" </dev/null >&2
  mv "$out.tmp" "$out"
}

# The Debian chain build.sh runs in the background: the packages, then the rootfs.
ready_debian() { [[ -z "$(missing_node_packages)" && -s "$base_rootfs_out" ]]; }
build_debian() {
  install_node_packages
  build_base_rootfs
}
