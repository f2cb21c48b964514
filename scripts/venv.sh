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
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
key="$(sha256sum constraints.txt | cut -c1-16)"
cache="${TORCHFLEX_CACHE:-$HOME/.cache/torchflex}"
pyver="$("$py" -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
shared="$cache/venvs/py$pyver-$key"
if [[ ! -x "$shared/.ready" ]]; then
  echo "[venv] creating $shared (first time on this machine: downloads torch, GBs)" >&2
  rm -rf "$shared"
  "$py" -m venv "$shared"
  "$shared/bin/pip" install -q --upgrade pip
  "$shared/bin/pip" install -q -c constraints.txt -e ".[operator,agent,dev,bench]"
  # Dependencies only: each checkout installs itself in its own layer.
  "$shared/bin/pip" uninstall -q -y torchflex
  printf '#!/bin/sh\nexit 0\n' > "$shared/.ready" && chmod +x "$shared/.ready"
fi

own="$cache/checkouts/py$pyver-$(printf '%s' "$root" | sha256sum | cut -c1-16)"
[[ -x "$own/bin/python" ]] || "$py" -m venv --without-pip "$own"
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
# A plain path line: the shared packages come after this layer's own on
# sys.path, and the shared layer's .pth files (an editable install of some
# checkout left by an older venv.sh) are never run.
purelib "$shared/bin/python" > "$(purelib "$own/bin/python")/torchflex-shared-venv.pth"
echo "$root" > "$own/checkout"
"$own/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || "$own/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
# The TorchX scheduler's extra (pyproject.toml, `torchx`: a few small packages) goes
# into this layer, not the shared one, so adding it never rebuilds the shared layer
# (keyed by constraints.txt); pip reaches the index only when the pin is missing.
want="$(sed -n 's/^ *"\(torchx-nightly==[^"]*\)".*/\1/p' pyproject.toml)"
if ! "$own/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('${want%%==*}') != '${want##*==}')" 2>/dev/null; then
  "$own/bin/python" -m pip install -q -c constraints.txt "$want"
fi
# The shared layer's console scripts, re-pointed at this layer's interpreter;
# binaries (ruff, kubectl, hadolint) linked as they are.
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
ln -sfn "$own" ".venv.tmp.$$"
mv -Tf ".venv.tmp.$$" .venv
echo "$own"
