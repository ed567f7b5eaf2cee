"""Run a rendered script on one machine without Slurm: stand-ins for ``scontrol`` and
``srun`` that do what the script asks of them (the head node's name and address; one
process per task of each ``srun ... : ...`` component, with Slurm's task variables, all
started at once as one step starts them). Used by ``scripts/gpu-check.sh`` and the tests.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

__all__ = ["write_standins"]


def write_standins(bin_dir: str | Path, *, node: str = "localhost", address: str = "127.0.0.1",
                   python: str | None = None) -> Path:
    """Write ``scontrol`` and ``srun`` into ``bin_dir`` (put it first on PATH); returns it."""
    b = Path(bin_dir)
    b.mkdir(parents=True, exist_ok=True)
    (b / "scontrol").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        if [ "$2" = hostnames ]; then echo {node}; else echo "NodeName={node} NodeAddr={address} State=IDLE"; fi
        """))
    (b / "srun").write_text(textwrap.dedent(f"""\
        #!{python or sys.executable}
        import os, subprocess, sys
        comps, cur = [], []
        for a in sys.argv[1:]:
            if a == ":":
                comps.append(cur); cur = []
            else:
                cur.append(a)
        comps.append(cur)
        tasks = []
        for c in comps:
            n = [int(a.split("=", 1)[1]) for a in c if a.startswith("--ntasks-per-node=")] or [1]
            tasks += [c[c.index("bash"):]] * n[0]
        procs = []
        for rank, argv in enumerate(tasks):
            env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NTASKS=str(len(tasks)), SLURM_LOCALID=str(rank))
            procs.append(subprocess.Popen(argv, env=env))
        sys.exit(max(p.wait() for p in procs))
        """))
    for f in (b / "scontrol", b / "srun"):
        f.chmod(0o755)
    return b
