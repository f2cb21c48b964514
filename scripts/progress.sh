# The setup steps' progress lines and logs, shared by scripts/venv.sh and
# e2e/toolchain/build.sh (sourced by both, after `set -euo pipefail`).
#
# One line per step on stderr: `[<prefix> k/n] what (2m14s so far)`, the time
# counted from $TORCHFLEX_BUILD_T0 (the Makefile sets it when make starts, so
# the venv's and the toolchain's lines share one clock), else from when the
# script sourced this file. What a step prints (pip, `go: downloading`, the
# compiler, apt) goes to the script's log file, never to the terminal; a step
# that fails says so, names the log and shows its last lines, and the script
# exits 1. The sourcing script sets progress_prefix and progress_n.

progress_t0="${TORCHFLEX_BUILD_T0:-}"
[[ "$progress_t0" =~ ^[0-9]+$ ]] || progress_t0="$(date +%s)"
progress_prefix="${progress_prefix:-setup}"
progress_n=0

# 45s, 2m14s, 1h02m: the time since progress_t0.
progress_since() {
  local s=$(( $(date +%s) - progress_t0 ))
  (( s >= 0 )) || s=0
  if (( s >= 3600 )); then printf '%dh%02dm' $(( s / 3600 )) $(( s % 3600 / 60 ))
  elif (( s >= 60 )); then printf '%dm%02ds' $(( s / 60 )) $(( s % 60 ))
  else printf '%ds' "$s"; fi
}

# progress_log_file NAME: a new log file $cache_root/logs/NAME-<UTC time>-<pid>.log
# (its folder made, NAME's logs older than two weeks removed); prints its path.
progress_log_file() {
  local dir="$cache_root/logs"
  mkdir -p "$dir"
  find "$dir" -maxdepth 1 -name "$1-*.log" -mtime +14 -delete 2>/dev/null || true
  echo "$dir/$1-$(date -u +%Y%m%dT%H%M%SZ)-$$.log"
}

# progress_line K WHAT: step K of progress_n starts.
progress_line() {
  echo "[$progress_prefix $1/$progress_n] $2 ($(progress_since) so far)" >&2
}

# progress_failed K WHAT LOG: say step K failed, where its output is, and exit 1.
progress_failed() {
  echo "[$progress_prefix $1/$progress_n] FAILED: $2, at $(progress_since); the end of $3:" >&2
  tail -n 25 "$3" | sed 's/^/    /' >&2
  exit 1
}

# progress_step K WHAT LOG COMMAND...: the step's line, then COMMAND with its
# output appended to LOG (under a header naming the step); exits on failure.
progress_step() {
  local k="$1" what="$2" log="$3" rc
  shift 3
  progress_line "$k" "$what"
  echo "==== [$progress_prefix $k/$progress_n] $what ($(progress_since)) ====" >> "$log"
  # errexit inside the subshell: in a `||` or `if` context bash would ignore it,
  # and a failed command halfway through a step would go unnoticed.
  set +e
  ( set -e; "$@" ) >> "$log" 2>&1
  rc=$?
  set -e
  (( rc == 0 )) || progress_failed "$k" "$what" "$log"
}
