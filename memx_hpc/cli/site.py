"""``memx-hpc site discover``: write a site file from what Slurm reports."""

from __future__ import annotations

import argparse
import sys

from .common import add_json, emit_json, table

HELP = "write a site file from Slurm's partitions, nodes and GRES (site discover)"
DESCRIPTION = """\
memx-hpc site discover reads the cluster through Slurm's own client
(scontrol show node / partition / reservation): partitions, node counts and states,
GRES type and count per node, CPUs, memory and features, and writes a site file
with one partition per Slurm partition whose nodes carry GPUs of one type:

  gpu_type       each GRES type named by a GPU type of the catalog: a catalog name or
                 alias (a100, mi250), or the GRES name's words (nvidia_a100-sxm4-80gb:
                 family, memory size, form factor), or --map; untyped GRES by the
                 nodes' features. A name that fits several parts is mapped only where a
                 catalog alias says which; the file's header names the others.
  nodes          the partition's nodes with that GPU count (their state now is noted;
                 'plan --finish' plans on the ones a job can get at planning time)
  cpus_per_task  the node's CPUs over its GPUs
  links          labelled defaults until 'memx-hpc profile --links' measures them
  python, megatron_entry   labelled defaults: set them for your nodes

Partitions without GPUs, with GPUs of several types, or not UP are left out, each
named with the reason. GRES types that name no catalog type stop the command with
the list of them (exit 1), unless --map names them or --skip-unknown leaves them
out. The file is read back as 'memx-hpc validate' reads it before it is written.

examples:
  memx-hpc site discover --out mysite.yaml
  memx-hpc site discover --map a100=A100-40 --map gpu_old=V100-32 --out mysite.yaml
  memx-hpc site discover --partition gpu_a100 --partition gpu_mi250x > mysite.yaml
  memx-hpc validate --site mysite.yaml && memx-hpc plan --site mysite.yaml --job jobs/llama2-7b.yaml
"""


SITE_DESCRIPTION = """\
Site files from the cluster itself.

actions:
  discover   write a site file from Slurm's partitions, nodes, GRES, CPUs and memory
             ('memx-hpc site discover --help')

examples:
  memx-hpc site discover --out mysite.yaml
  memx-hpc site discover --map a100=A100-40 --out mysite.yaml
"""


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("site", help=HELP, description=SITE_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="site_command", metavar="ACTION")
    d = actions.add_parser("discover", help="write a site file from what Slurm reports", description=DESCRIPTION,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--out", metavar="FILE", default="-",
                   help="where the site file goes ('-', the default: standard output)")
    d.add_argument("--force", action="store_true", help="replace --out when it exists")
    d.add_argument("--map", action="append", default=[], metavar="KEY=GPU-TYPE",
                   help="name the GPU type of a GRES type or of a partition (repeatable), e.g. a100=A100-40")
    d.add_argument("--partition", action="append", metavar="NAME",
                   help="only this Slurm partition (repeatable; default: every partition with GPUs)")
    d.add_argument("--name", metavar="NAME", help="the site's name (default: Slurm's ClusterName)")
    d.add_argument("--gpu-types", metavar="FILE.yaml",
                   help="GPU types beyond the catalog, as a site file's gpu_types: mapping (name: figures); "
                        "written into the site for the partitions that use them")
    d.add_argument("--skip-unknown", action="store_true",
                   help="leave out partitions whose GRES type names no GPU type (noted in the file) instead "
                        "of stopping")
    add_json(d)
    p.set_defaults(_site_parser=p)
    return p


def _gpu_types(path: str | None):
    from ..errors import SpecError
    from ..spec import GpuType, _wrap_file, load_yaml

    if path is None:
        return ()
    data = load_yaml(path)

    def build():
        if not isinstance(data, dict):
            raise SpecError("expected a mapping of GPU type name to its figures", found=type(data).__name__)
        return tuple(GpuType.from_mapping(v, str(k), name=str(k)) for k, v in data.items())
    return _wrap_file(build, path)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..errors import SpecError, SystemFailure
    from ..planner import discover_site
    from ..sitegen import parse_map
    from ..spec import load_site

    if args.site_command != "discover":
        args._site_parser.print_help()
        return 1
    out = None if args.out == "-" else Path(args.out)
    if args.json and out is None:
        raise SpecError("--json prints a report, so the site file needs a place of its own", field="--out",
                        found="-", allowed="a file path")
    if out is not None and out.exists() and not args.force:
        raise SpecError("exists; give --force to replace it", file=str(out))
    types = _gpu_types(args.gpu_types)
    mapping = parse_map(args.map, types)
    found = discover_site(mapping=mapping, partitions=args.partition, site_types=types, name=args.name)
    if args.skip_unknown:
        found = found.named()
    text = found.yaml()  # SpecError listing the unnamed GRES types
    found.site()  # what validate will read: refuse to write a file it would not accept
    if out is None:
        sys.stdout.write(text)
    else:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out)
        except OSError as e:
            raise SystemFailure(f"cannot write the site file {out}: {e.strerror or e}") from None
        load_site(out)
    if args.json:
        emit_json({**found.to_json(), "file": str(out)})
        return 0
    report = sys.stderr if out is None else sys.stdout
    print(f"cluster {found.cluster}: {len(found.partitions)} partition(s) for the site, "
          f"{len(found.skipped)} left out", file=report)
    table([(p.name, f"gpu:{p.gres_type or '(untyped)'}", p.nodes, p.gpus_per_node, p.gpu_type, p.match.how,
            ", ".join(f"{k} {w}" for w, k in p.states)) for p in found.partitions],
          ["partition", "gres", "nodes", "gpus/node", "gpu type", "named by", "nodes now"], file=report)
    for name, why in found.skipped:
        print(f"left out {name}: {why}", file=report)
    for p in found.partitions:
        if p.match.alternatives:
            print(f"note: {p.name}: gpu:{p.gres_type} also fits {', '.join(p.match.alternatives)}; "
                  f"--map {p.gres_type}={p.match.alternatives[0]} if these are those", file=report)
    for n in found.notes:
        print(f"note: {n}", file=report)
    if out is not None:
        print(f"wrote {out}; next: memx-hpc validate --site {out}, then memx-hpc plan --site {out} --job JOB.yaml",
              file=report)
    return 0
