#!/bin/bash
# The GPU check: on one GPU, within 8 minutes, profile a handful of points, fit and plan,
# train a few iterations with NCCL through the rendered script's own entry, and print
# predicted against measured time and memory (allocator, reserved, driver).
#
#   scripts/gpu-check.sh [OUT_DIR]          # on a machine with one CUDA/ROCm GPU
#   scripts/gpu-check.sh OUT_DIR --cpu-rehearsal   # the same steps on the CPU (what CI runs)
#
# Python: $PYTHON, else .venv/bin/python. Exit 0 when every step ran, 2 when one failed
# (it names the step), 124 when the 8 minutes ran out.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT="${1:-$(mktemp -d -t memx-gpu-check.XXXXXX)}"
shift || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout "${MEMX_GPU_CHECK_TIMEOUT_S:-480}" "$PY" scripts/gpu_check.py --out "$OUT" "$@"
