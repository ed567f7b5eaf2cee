#!/usr/bin/env bash
# The one install command for a developer or CI machine (CPU-only, Python 3.11+).
#
#   scripts/install.sh                 # .venv + memx-hpc with the cpu, profile, test, data extras
#   scripts/install.sh --with-slurm    # also the Debian packages for the local Slurm
#                                      # cluster (scripts/slurm-local.sh install; root)
#   scripts/install.sh -- ARGS...      # extra arguments passed on to pip install
#
# Creates .venv with python3.11 when it is missing, then installs this package in
# editable mode against constraints/cpu.txt, which pins torch (and megatron-core):
# a torch requirement left free would make pip pull a multi-GB CUDA build.
# Safe to rerun: pip only installs what is missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=.venv
CONSTRAINTS=constraints/cpu.txt
EXTRAS='.[cpu,profile,test,data]'

log() { printf '[install] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

with_slurm=0
pip_extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --with-slurm) with_slurm=1 ;;
    --) shift; pip_extra=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
  shift
done

t0=$SECONDS
[[ -f $CONSTRAINTS ]] || die "$CONSTRAINTS is missing"
grep -Eq '^torch==' "$CONSTRAINTS" || die "$CONSTRAINTS does not pin torch; refusing to let pip choose one"

if [[ $with_slurm == 1 ]]; then
  log "Debian packages for the local Slurm cluster"
  scripts/slurm-local.sh install
fi

find_python() {
  local c
  for c in "${PYTHON:-}" python3.11 python3; do
    [[ -n $c ]] || continue
    command -v "$c" >/dev/null 2>&1 || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

if [[ ! -e $VENV/bin/python ]]; then
  py=$(find_python) || die "no Python >= 3.11 found (tried \$PYTHON, python3.11, python3)"
  log "creating $VENV with $py ($("$py" --version 2>&1))"
  "$py" -m venv "$VENV" ||
    die "'$py -m venv' failed; on Debian install python3-venv (apt-get install python3-venv)"
elif ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
  die "$VENV/bin/python does not run (its base Python moved?); remove $VENV and rerun"
fi

log "pip install -c $CONSTRAINTS -e '$EXTRAS' ${pip_extra[*]}"
"$VENV/bin/python" -m pip install -c "$CONSTRAINTS" -e "$EXTRAS" "${pip_extra[@]}"

# A quick check that the stack imports, and which torch build was installed.
"$VENV/bin/python" -W ignore::UserWarning - <<'PY'
import importlib
import torch
mods = ["memx_hpc", "megatron.core", "xgboost", "sklearn", "h5py", "submitit", "mpi4py", "pytest"]
for m in mods:
    importlib.import_module(m)
cuda = torch.version.cuda
print(f"[install] torch {torch.__version__} ({'CUDA ' + cuda if cuda else 'CPU build'}); "
      f"imports ok: {', '.join(mods)}")
PY
log "done in $((SECONDS - t0)) s"
