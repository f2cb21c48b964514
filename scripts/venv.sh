#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv and links it at .venv.
#
# Where it sits: `make venv` runs it; `.ci/run` and every other make target
# depend on it. The environment itself lives in ~/.cache keyed by the hash of
# constraints.txt (every dependency is pinned there), so a second clone or CI run on the same
# machine reuses it (torch is GBs). The project is installed editable into
# it on every call (cheap), so the console scripts point at this checkout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
key="$(sha256sum constraints.txt | cut -c1-16)"
cache="${TORCHFLEX_CACHE:-$HOME/.cache/torchflex}"
venv="$cache/venvs/py$("$py" -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')-$key"
if [[ ! -x "$venv/.ready" ]]; then
  echo "[venv] creating $venv (first time on this machine: downloads torch, GBs)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -c constraints.txt -e ".[operator,agent,dev,bench]"
  printf '#!/bin/sh\nexit 0\n' > "$venv/.ready" && chmod +x "$venv/.ready"
else
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
fi
ln -sfn "$venv" .venv
echo "$venv"
