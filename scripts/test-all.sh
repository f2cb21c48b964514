#!/usr/bin/env bash
# `make test` (and so CI): every tier, in two lanes that share nothing.
#
# Lane 1 is the unit, integration and e2e tiers on the cluster slot of
# $TORCHFLEX_CLUSTER_SLOT (default 0). Lane 2 is the real-node tier on a slot
# of its own ($TORCHFLEX_REAL_NODE_SLOT, default the first slot four above it,
# modulo 8): its own control plane, bridge, node and registry port, so the two
# lanes never touch each other's objects or addresses. Lint (ruff, mypy,
# import-linter, drift checks) runs beside them. Most of either lane's time is
# spent waiting on clusters and trainers, so running them side by side takes
# minutes off the whole run; lint's and lane 2's output are printed after lane
# 1's, whole, so no log is interleaved.
# Exit status: non-zero when any lane failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

py=.venv/bin/python
slot=${TORCHFLEX_CLUSTER_SLOT:-0}
real_slot=${TORCHFLEX_REAL_NODE_SLOT:-$(((slot + 4) % 8))}
if [[ "$real_slot" == "$slot" ]]; then
  echo "TORCHFLEX_REAL_NODE_SLOT ($real_slot) must differ from TORCHFLEX_CLUSTER_SLOT ($slot)" >&2
  exit 2
fi

real_log=$(mktemp -t torchflex-realnode.XXXXXX.log)
lint_log=$(mktemp -t torchflex-lint.XXXXXX.log)
TORCHFLEX_CLUSTER_SLOT=$real_slot "$py" -m pytest tests/realnode >"$real_log" 2>&1 &
real_pid=$!
make --no-print-directory lint >"$lint_log" 2>&1 &
lint_pid=$!
# Ctrl-C or a CI timeout stops the other lane too (its pytest tears its cluster down).
trap 'kill -INT "$real_pid" "$lint_pid" 2>/dev/null; wait; cat "$lint_log" "$real_log"; rm -f "$lint_log" "$real_log"; exit 130' INT TERM

# Lane 1 has no real node: it must not reach for lane 2's images folder either.
env -u TORCHFLEX_IMAGES_DIR "$py" -m pytest tests --ignore=tests/realnode
main_rc=$?

wait "$lint_pid"
lint_rc=$?
wait "$real_pid"
real_rc=$?
trap - INT TERM
echo
echo "==================== make lint ===================="
cat "$lint_log"
echo
echo "==================== tests/realnode (cluster slot $real_slot) ===================="
cat "$real_log"
rm -f "$lint_log" "$real_log"
echo "lint: rc=$lint_rc; unit, integration and e2e: rc=$main_rc; real nodes: rc=$real_rc"
((lint_rc == 0 && main_rc == 0 && real_rc == 0))
