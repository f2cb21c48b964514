#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv and links it at .venv.
#
# Where it sits: `make venv` runs it; `.ci/run` and every other make target
# depend on it. Two layers:
#   - the shared environment, in ~/.cache keyed by the hash of constraints.txt
#     (every dependency is pinned there): torch and the rest, GBs, built once per
#     machine and never holding this project itself;
#   - a small environment per checkout (~/.cache/torchflex/checkouts/, keyed by
#     the checkout's path) that sees the shared one's packages through a .pth
#     file and has this checkout installed editable, with every console script
#     (pytest, torchrun, lint-imports, torchflex-agent, ...) running its own
#     interpreter. So a second clone's `make venv` never re-points another
#     checkout's python, pods or scripts at its code.
# .venv is a symlink to the per-checkout environment, swapped by a rename, so
# `.venv/bin/python` stays usable while this runs.
# Progress: one line per step that does work, on stderr (`[venv k/n] what (time
# so far)`, scripts/progress.sh); pip's output goes to a log under the cache
# that a failed step names. A warm run prints nothing: a stamp of what the
# checkout's layer was made from (this script, pyproject.toml, the packages'
# folders, the shared layer) skips pip when none of it changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
key="$(sha256sum constraints.txt | cut -c1-16)"
cache_root="${TORCHFLEX_CACHE:-$HOME/.cache/torchflex}"
pyver="$("$py" -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
shared="$cache_root/venvs/py$pyver-$key"
own="$cache_root/checkouts/py$pyver-$(printf '%s' "$root" | sha256sum | cut -c1-16)"
# The TorchX scheduler's extra (pyproject.toml, `torchx`: a few small packages) goes
# into this layer, not the shared one, so adding it never rebuilds the shared layer
# (keyed by constraints.txt); pip reaches the index only when the pin is missing.
want="$(sed -n 's/^ *"\(torchx-nightly==[^"]*\)".*/\1/p' pyproject.toml)"
stamp_of() {
  {
    echo "$root" "$shared" "$want"
    cat "${BASH_SOURCE[0]}" pyproject.toml
    ls -d operator/*/ agent/*/ contract/*/ submit/*/ 2>/dev/null
  } | sha256sum | cut -c1-16
}
stamp="$(stamp_of)"
if [[ -x "$shared/.ready" && -x "$own/bin/python" && "$(cat "$own/.stamp" 2>/dev/null)" == "$stamp" ]]; then
  # Warm: only the link (another checkout of this path may have swapped it).
  [[ "$(readlink .venv 2>/dev/null)" == "$own" ]] || { ln -sfn "$own" ".venv.tmp.$$" && mv -Tf ".venv.tmp.$$" .venv; }
  echo "$own"
  exit 0
fi

# shellcheck source=progress.sh
progress_prefix=venv
source "$root/scripts/progress.sh"
new_shared=0
[[ -x "$shared/.ready" ]] || new_shared=1
progress_n=$(( 2 * new_shared + 1 ))
venv_log="$(progress_log_file venv)"
(( new_shared )) && echo "[venv] the shared environment (first time on this machine: torch, GBs) in $shared; pip's output: $venv_log" >&2

shared_pip() {
  rm -rf "$shared"
  "$py" -m venv "$shared"
  "$shared/bin/pip" install --upgrade pip
}
shared_packages() {
  "$shared/bin/pip" install -c constraints.txt -e ".[operator,agent,dev,bench]"
  # Dependencies only: each checkout installs itself in its own layer.
  "$shared/bin/pip" uninstall -y torchflex
  printf '#!/bin/sh\nexit 0\n' > "$shared/.ready" && chmod +x "$shared/.ready"
}
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
own_layer() {
  [[ -x "$own/bin/python" ]] || "$py" -m venv --without-pip "$own"
  # A plain path line: the shared packages come after this layer's own on
  # sys.path, and the shared layer's .pth files (an editable install of some
  # checkout left by an older venv.sh) are never run.
  purelib "$shared/bin/python" > "$(purelib "$own/bin/python")/torchflex-shared-venv.pth"
  echo "$root" > "$own/checkout"
  "$own/bin/python" -m pip install --no-deps --no-build-isolation -e .
  if ! "$own/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('${want%%==*}') != '${want##*==}')" 2>/dev/null; then
    "$own/bin/python" -m pip install -c constraints.txt "$want"
  fi
  # The shared layer's console scripts, re-pointed at this layer's interpreter;
  # binaries (ruff, kubectl, hadolint) linked as they are.
  local f name
  for f in "$shared"/bin/*; do
    name="${f##*/}"
    case "$name" in
      python* | pip* | activate* | Activate.ps1 | torchflex-*) continue ;;
    esac
    if [[ "$(head -c 2 "$f")" == "#!" ]] && head -n 1 "$f" | grep -q "^#!$shared/bin/python"; then
      { echo "#!$own/bin/python"; tail -n +2 "$f"; } > "$own/bin/.$name.tmp"
      chmod +x "$own/bin/.$name.tmp"
      mv -f "$own/bin/.$name.tmp" "$own/bin/$name"
    else
      ln -sfn "$f" "$own/bin/$name"
    fi
  done
  echo "$stamp" > "$own/.stamp"
}

k=0
if (( new_shared )); then
  progress_step $(( k += 1 )) "a Python ${pyver:0:1}.${pyver:1} environment with pip" "$venv_log" shared_pip
  progress_step $(( k += 1 )) "torch and every pinned dependency (constraints.txt; GBs)" "$venv_log" shared_packages
fi
progress_step $(( k += 1 )) "this checkout's layer ($own: the project editable, ${want:-no torchx})" "$venv_log" own_layer
ln -sfn "$own" ".venv.tmp.$$"
mv -Tf ".venv.tmp.$$" .venv
echo "$own"
