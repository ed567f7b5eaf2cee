#!/usr/bin/env bash
# The README's test command: from a fresh clone on a Debian 12 machine (as root):
#   1. scripts/install.sh --with-slurm   (Debian Slurm packages + .venv)
#   2. scripts/slurm-local.sh start      (the private local Slurm cluster)
#   3. .venv/bin/python -m pytest -q tests
# Slurm is stopped on exit whatever happens (unless it was already running before
# this script). Any failure, and pytest's exit 5 (no tests ran), fails the run.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export DEBIAN_FRONTEND=noninteractive
# A hung test must not eat CI's whole budget silently: fail with output instead.
TEST_TIMEOUT_S="${MEMX_CI_TEST_TIMEOUT_S:-4500}"

T_START=$SECONDS
declare -a TIMINGS=()
phase_t0=0
phase_name=""
begin() { phase_name=$1; phase_t0=$SECONDS; printf '\n===== [test] %s =====\n' "$1"; }
end() {
  TIMINGS+=("$(printf '%-14s %5d s' "$phase_name" $((SECONDS - phase_t0)))")
  printf '===== [test] %s done in %d s =====\n' "$phase_name" $((SECONDS - phase_t0))
  phase_name=""
}

we_started_slurm=0
on_exit() {
  local rc=$?
  if [[ -n $phase_name ]]; then
    TIMINGS+=("$(printf '%-14s %5d s (FAILED)' "$phase_name" $((SECONDS - phase_t0)))")
  fi
  if [[ $we_started_slurm == 1 ]]; then
    begin "slurm stop"
    scripts/slurm-local.sh stop || echo "[test] warning: slurm-local.sh stop failed" >&2
    end
  fi
  printf '\n===== [test] timings =====\n'
  local t
  for t in "${TIMINGS[@]}"; do printf '  %s\n' "$t"; done
  printf '  %-14s %5d s\n' total $((SECONDS - T_START))
  if [[ $rc -eq 0 ]]; then echo "[test] OK"; else echo "[test] FAILED (exit $rc)"; fi
  exit "$rc"
}
trap on_exit EXIT

begin "install"
scripts/install.sh --with-slurm </dev/null
end

begin "slurm start"
if scripts/slurm-local.sh status >/dev/null 2>&1; then
  echo "[test] a local Slurm cluster was already running; using it and leaving it running"
else
  we_started_slurm=1
fi
scripts/slurm-local.sh start </dev/null
end

begin "tests"
set +e
timeout --foreground -k 30 "$TEST_TIMEOUT_S" .venv/bin/python -m pytest -q tests </dev/null
rc=$?
set -e
case $rc in
  0) ;;
  5) echo "[test] pytest collected no tests (exit 5): failing" >&2; exit 5 ;;
  124|137) echo "[test] tests timed out after ${TEST_TIMEOUT_S} s" >&2; exit "$rc" ;;
  *) echo "[test] pytest failed (exit $rc)" >&2; exit "$rc" ;;
esac
end
