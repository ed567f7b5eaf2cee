"""``memx-hpc``: the command line. ``main(argv)`` returns the exit code (testable).

Exit codes: 0 success, 1 user error (bad input), 2 system error (Slurm/MPI
unreachable, a job failed).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..errors import MemxError

# One module per subcommand under memx_hpc/cli/. Each defines
#   register(subparsers) -> argparse.ArgumentParser   (argparse only; no heavy imports)
#   run(args) -> int
SUBCOMMANDS = ("plan", "profile", "fit", "search", "predict", "render", "verify", "simulate", "validate", "status", "site",
               "data")

DESCRIPTION = """\
Plan Megatron-LM training on heterogeneous, cross-vendor Slurm clusters.

memx-hpc finds the parallel configuration (tensor, pipeline and data parallel
degrees, micro-batch, layers per pipeline stage, recomputation per stage) and the
GPU partitions to run it on that minimises a weighted product of iteration time,
peak memory and memory imbalance - without running out of memory - and renders
the sbatch script that launches it.

The usual flow, on a login node:
  memx-hpc site discover --out mysite.yaml             a site file from Slurm
  memx-hpc validate --site mysite.yaml --job job.yaml   check the files
  memx-hpc plan --site mysite.yaml --job job.yaml       profile what is missing,
                                                        fit, search, report
  memx-hpc render --site mysite.yaml --plan out/plan-1.json
  memx-hpc verify --site mysite.yaml --job job.yaml --top 3
"""

EPILOG = """\
exit codes: 0 success, 1 bad input (the message names the file and field),
2 system error (the message names the path or service: Slurm or MPI unreachable,
a job failed, a file that cannot be read or written).
Run 'memx-hpc COMMAND --help' for each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memx-hpc", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from .. import __version__
    parser.add_argument("--version", action="version", version=f"memx-hpc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"memx_hpc.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"memx_hpc.cli.{name}":
                raise
            continue
        p = mod.register(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2 -> 1: bad input)
        code = e.code if isinstance(e.code, int) else 1
        return 1 if code == 2 else code
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        return int(args._run(args) or 0)
    except MemxError as e:
        print(f"memx-hpc {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        # Last resort: each layer names its own faults, but a file or folder this command
        # could not use (unwritable --out, a full disk) still gets one line and exit 2.
        print(f"memx-hpc {args.command}: error: {_os_error(e)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"memx-hpc {args.command}: error: out of memory; reduce the search space or the input",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"memx-hpc {args.command}: interrupted; finished work is kept, rerun to continue", file=sys.stderr)
        return 130


def _os_error(e: OSError) -> str:
    """``path: reason`` for an OSError (both paths for a rename)."""
    reason = e.strerror or str(e) or type(e).__name__
    paths = [str(p) for p in (e.filename, e.filename2) if p]
    return f"{' -> '.join(paths)}: {reason}" if paths else f"{reason} ({type(e).__name__})"


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
