"""A site file from what Slurm reports: ``memx-hpc site discover``.

:func:`discover` turns a :class:`~memx_hpc.slurm.discover.ClusterView` (partitions, nodes,
GRES, CPUs, memory, features, states) into a :class:`Discovery`: one site partition per
Slurm partition whose nodes carry GPUs of one type, each GRES type mapped to a GPU type of
the catalog (or of ``site_types``), and a list of what was left out and why.
:meth:`Discovery.yaml` writes it as a site file that ``memx-hpc validate`` and ``plan``
read; the figures Slurm does not know (link bandwidths, the partitions' Python and
Megatron-LM entry) are written as defaults and labelled so.

A GRES type becomes a GPU type by, in this order: the user's ``--map KEY=TYPE`` (KEY a
GRES type or a partition name); a catalog name or alias equal to it (``a100``,
``mi250``, case-insensitive); its words (Slurm's NVML/RSMI autodetection names GPUs
``nvidia_a100-sxm4-80gb``, ``tesla_v100-pcie-16gb``): the catalog family (``a100``) narrowed
by the memory size in GB and the form factor (``pcie``, ``sxm``, ``nvl``) when it names
them; for untyped GRES, the nodes' features the same way. A name that fits several parts
(``a100``: 40 or 80 GB) is mapped only when a catalog alias says which, and the report
names the others.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping

from .spec.catalog import catalog
from .errors import SpecError
from .spec import MAX_GPUS_PER_NODE, SAFE_NAME_RULE, GpuType, Site, _SAFE_NAME, _suggest, parse_yaml, site_from_mapping
from .slurm.discover import ClusterView, SlurmNode

__all__ = ["GpuMatch", "DiscoveredPartition", "Discovery", "discover", "match_gpu", "parse_map",
           "DEFAULT_INTER_NODE_GBPS", "DEFAULT_INTER_PARTITION_GBPS"]

#: the figures written where Slurm knows nothing of the links (GB/s per direction): the
#: site loader's own defaults, labelled as such in the file
DEFAULT_INTER_NODE_GBPS = 25.0
DEFAULT_INTER_PARTITION_GBPS = 12.5
DEFAULT_TIME_LIMIT_MIN = 60

_FORMS = ("pcie", "sxm", "nvl")
_VENDOR_WORDS = {"nvidia", "tesla", "amd", "instinct", "radeon", "intel", "geforce", "quadro", "gpu", "hbm2",
                 "hbm2e", "hbm3", "hbm3e"}


# --------------------------------------------------------------------------- matching


@dataclass(frozen=True, kw_only=True)
class GpuMatch:
    """How one GRES type (None: untyped) was named: ``gpu_type`` None when it was not;
    ``how`` says from what; ``alternatives``: other types the name could be."""

    gres_type: str | None
    gpu_type: str | None
    how: str
    alternatives: tuple[str, ...] = ()


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[-_ .]+", name.lower()) if t]


def _family(name: str) -> str:
    """The part's family word: the first with a digit (``A100-80`` -> ``a100``, ``RTX-2080``
    -> ``2080``), else the first."""
    toks = _tokens(name)
    return next((t for t in toks if any(c.isdigit() for c in t)), toks[0] if toks else "")


def _names(g: GpuType) -> list[str]:
    return [g.name] + list(g.aliases)


def _nominal_gb(g: GpuType) -> tuple[float, float]:
    """The memory as a datasheet states it in GB, and in GiB (catalog figures are either)."""
    return g.memory_gib * 2**30 / 1e9, g.memory_gib


def _form(g: GpuType) -> str | None:
    words = " ".join(_names(g)).lower()
    return next((f for f in _FORMS if f in words), None)


def match_gpu(name: str | None, types: Iterable[GpuType], *, features: Iterable[str] = ()) -> GpuMatch:
    """The GPU type a GRES type names (see the module docstring); untyped GRES (None) are
    matched by the nodes' ``features``."""
    types = tuple(types)
    if name is None:
        hits = [(f, match_gpu(f, types)) for f in features]
        named = {m.gpu_type: f for f, m in hits if m.gpu_type is not None}
        if len(named) == 1:
            gpu, feat = next(iter(named.items()))
            return GpuMatch(gres_type=None, gpu_type=gpu, how=f"untyped GRES; node feature {feat!r}")
        return GpuMatch(gres_type=None, gpu_type=None,
                        how="untyped GRES (gpu:N) and no node feature names a GPU type" if not named else
                        "untyped GRES; node features name several GPU types", alternatives=tuple(sorted(named)))
    low = name.lower()
    exact = [g for g in types if any(n.lower() == low for n in _names(g))]
    fam = _family(name)
    same_family = [g for g in types if _family(g.name) == fam or any(_family(a) == fam for a in g.aliases)]
    if len(exact) == 1:
        g = exact[0]
        which = "catalog name" if g.name.lower() == low else "catalog alias"
        others = tuple(x.name for x in same_family if x.name != g.name)
        return GpuMatch(gres_type=name, gpu_type=g.name, how=f"{which} {name!r}", alternatives=others)
    toks = _tokens(name)
    families = {_family(g.name) for g in types} | {_family(a) for g in types for a in g.aliases}
    fam = next((t for t in toks if t in families and t not in _VENDOR_WORDS), None)
    if fam is None:
        return GpuMatch(gres_type=name, gpu_type=None, how="no catalog GPU type has this name")
    cands = [g for g in types if fam in {_family(n) for n in _names(g)}]
    said = [fam]
    gb = next((float(m.group(1)) for t in toks for m in [re.fullmatch(r"(\d+(?:\.\d+)?)g[bi]?b?", t)] if m), None)
    if gb is not None:
        # within 6 %: a datasheet GB figure against the catalog GB or GiB one, but not the next
        # size of the family (H100 80 GB against the NVL 94 GB)
        cands = [g for g in cands if any(abs(x - gb) <= 0.06 * gb for x in _nominal_gb(g))]
        said.append(f"{gb:g} GB")
    form = next((f for f in _FORMS for t in toks if t.startswith(f)), None)
    if form is not None:
        same = [g for g in cands if _form(g) == form]
        if same:
            cands = same
        elif form == "sxm":  # SXM is the catalog's default form: drop the PCIe/NVL variants
            cands = [g for g in cands if _form(g) is None] or cands
        said.append(form)
    if len(cands) == 1:
        return GpuMatch(gres_type=name, gpu_type=cands[0].name, how=f"from the GRES name ({', '.join(said)})")
    if not cands:
        return GpuMatch(gres_type=name, gpu_type=None,
                        how=f"no catalog GPU type fits the GRES name ({', '.join(said)})")
    return GpuMatch(gres_type=name, gpu_type=None, how=f"the GRES name ({', '.join(said)}) fits several parts",
                    alternatives=tuple(g.name for g in cands))


def parse_map(items: Iterable[str], types: Iterable[GpuType]) -> dict[str, str]:
    """``["a100=A100-40", "gpu_v100=V100-32"]`` -> ``{key: GPU type name}``; every type must be
    a catalog name or alias or one of ``types`` (SpecError naming ``--map``)."""
    types = tuple(types)
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise SpecError("expected GRES=GPU-TYPE or PARTITION=GPU-TYPE", field="--map", found=item,
                            allowed="e.g. --map a100=A100-40 (memx-hpc validate --list-gpus lists the types)")
        hit = next((g for g in types if g.name == value or value in g.aliases), None) or catalog().find(value)
        if hit is None:
            names = sorted({g.name for g in catalog()} | {g.name for g in types})
            raise SpecError("not a GPU type of the catalog" + _suggest(value, names), field=f"--map {key}", found=value,
                            allowed=", ".join(names) + " (or define it under gpu_types: in the site file)")
        if key in out and out[key] != hit.name:
            raise SpecError("given twice with different types", field=f"--map {key}", found=[out[key], hit.name])
        out[key] = hit.name
    return out


# --------------------------------------------------------------------------- partitions


@dataclass(frozen=True, kw_only=True)
class DiscoveredPartition:
    """One site partition read from Slurm; ``gpu_type`` None while its GRES type is unnamed."""

    name: str
    match: GpuMatch
    gres_type: str | None
    nodes: int
    gpus_per_node: int
    cpus_per_task: int | None
    real_memory_mib: int
    max_time_min: int | None
    features: tuple[str, ...]
    states: tuple[tuple[str, int], ...]
    notes: tuple[str, ...] = ()

    @property
    def gpu_type(self) -> str | None:
        return self.match.gpu_type


@dataclass(frozen=True, kw_only=True)
class Discovery:
    """What ``site discover`` found: the partitions (named or not), what was left out and why,
    and notes for the file's header."""

    cluster: str
    read_at: datetime
    partitions: tuple[DiscoveredPartition, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    site_types: tuple[GpuType, ...] = ()
    name: str = ""

    @property
    def unknown(self) -> tuple[DiscoveredPartition, ...]:
        return tuple(p for p in self.partitions if p.gpu_type is None)

    def check_named(self) -> None:
        """SpecError listing every GRES type that names no GPU type, and how to name it."""
        if not self.unknown:
            return
        by_key: dict[str, list[DiscoveredPartition]] = {}
        for p in self.unknown:
            by_key.setdefault(p.gres_type or f"(untyped, partition {p.name})", []).append(p)
        lines = []
        for key, parts in by_key.items():
            m = parts[0].match
            where = ", ".join(f"{p.name}: {p.nodes} node{'s' if p.nodes != 1 else ''} x {p.gpus_per_node}"
                              for p in parts)
            alt = f"; one of: {', '.join(m.alternatives)}" if m.alternatives else ""
            lines.append(f"  gpu:{key} ({where}): {m.how}{alt}")
        keys = [p.gres_type or p.name for p in self.unknown]
        example = f"--map {keys[0]}=GPU-TYPE"
        raise SpecError(f"{len(by_key)} GPU GRES type{'s' if len(by_key) != 1 else ''} of cluster {self.cluster} "
                        f"name no GPU type of the catalog:\n" + "\n".join(lines) +
                        f"\nname each with {example} (a GRES type or a partition name; "
                        "'memx-hpc validate --list-gpus' lists the types), or leave them out with --skip-unknown",
                        field="--map")

    def named(self) -> "Discovery":
        """The same discovery without the partitions whose GPU type is unnamed (noted as left out)."""
        skipped = self.skipped + tuple((p.name, f"GRES gpu:{p.gres_type or '(untyped)'} names no GPU type "
                                                f"({p.match.how}); --map it to include it")
                                       for p in self.unknown)
        return Discovery(cluster=self.cluster, read_at=self.read_at, name=self.name,
                         partitions=tuple(p for p in self.partitions if p.gpu_type is not None),
                         skipped=skipped, notes=self.notes, site_types=self.site_types)

    def gpu(self, name: str) -> GpuType:
        return next((g for g in self.site_types if g.name == name), None) or catalog().get(name)

    def vendors(self) -> list[str]:
        return sorted({self.gpu(p.gpu_type).vendor for p in self.partitions if p.gpu_type is not None})

    def yaml(self) -> str:
        """The site file (SpecError when a GRES type is unnamed or nothing is left)."""
        self.check_named()
        if not self.partitions:
            raise SpecError(f"no partition of cluster {self.cluster} has GPUs of one type to plan on" +
                            "".join(f"\n  {n}: {why}" for n, why in self.skipped), field="partitions")
        return _write(self)

    def site(self, *, source_file: str | None = None) -> Site:
        """The site the file describes, as ``validate`` and ``plan`` read it."""
        return site_from_mapping(parse_yaml(self.yaml()), source_file=source_file)

    def to_json(self) -> dict:
        return {
            "cluster": self.cluster, "site": self.name, "read_at": self.read_at.isoformat(timespec="seconds"),
            "partitions": [{"name": p.name, "gres_type": p.gres_type, "gpu_type": p.gpu_type, "how": p.match.how,
                            "alternatives": list(p.match.alternatives), "nodes": p.nodes,
                            "gpus_per_node": p.gpus_per_node, "cpus_per_task": p.cpus_per_task,
                            "real_memory_mib": p.real_memory_mib, "max_time_min": p.max_time_min,
                            "features": list(p.features), "states": dict(p.states), "notes": list(p.notes)}
                           for p in self.partitions],
            "skipped": [{"partition": n, "why": w} for n, w in self.skipped],
            "notes": list(self.notes),
        }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def discover(view: ClusterView, *, mapping: Mapping[str, str] | None = None,
             partitions: Iterable[str] | None = None, site_types: Iterable[GpuType] = (),
             name: str | None = None) -> Discovery:
    """The site partitions ``view`` supports (see the module docstring). ``mapping``: from
    :func:`parse_map`; ``partitions``: only these Slurm partitions (SpecError for a name Slurm
    does not have); ``site_types``: GPU types beyond the catalog; ``name``: the site's name
    (default: the cluster's)."""
    mapping = dict(mapping or {})
    site_types = tuple(site_types)
    types = tuple(site_types) + tuple(g for g in catalog() if g.name not in {t.name for t in site_types})
    slurm_names = [p.name for p in view.partitions]
    wanted = list(partitions) if partitions is not None else None
    for w in wanted or ():
        if w not in slurm_names:
            raise SpecError("not a partition of this cluster", field="--partition", found=w,
                            allowed=", ".join(slurm_names))
    kept: list[DiscoveredPartition] = []
    skipped: list[tuple[str, str]] = []
    used_keys: set[str] = set()
    gres_seen: set[str] = set()
    for sp in view.partitions:
        if wanted is not None and sp.name not in wanted:
            continue
        nodes = view.nodes_of(sp.name)
        for n in nodes:
            gres_seen.update(g.type for g in n.gpus if g.type)
        odd = next((n for n in nodes if n.bad_gpus), None)
        if odd is not None:
            skipped.append((sp.name, f"node {odd.name} reports GPU GRES {', '.join(odd.bad_gpus)[:80]!r}, not a "
                                     f"count up to {MAX_GPUS_PER_NODE}"))
            continue
        if not _SAFE_NAME.fullmatch(sp.name):
            skipped.append((sp.name, f"its name is not one a site file takes ({SAFE_NAME_RULE})"))
            continue
        if not sp.up:
            skipped.append((sp.name, f"partition state {sp.state}: no job starts there now"))
            continue
        if not nodes:
            skipped.append((sp.name, "no nodes"))
            continue
        gpu_nodes = [n for n in nodes if n.gpus]
        if not gpu_nodes:
            skipped.append((sp.name, "no GPUs (no gpu GRES on its nodes)"))
            continue
        types_here = Counter(_node_type(n) for n in gpu_nodes)
        if "+" in types_here:
            skipped.append((sp.name, "its nodes carry GPUs of several types each; a site partition has one"))
            continue
        if len(types_here) > 1:
            labels = sorted(t or "(untyped)" for t in types_here)
            elsewhere = _elsewhere(view, sp.name, gpu_nodes)
            skipped.append((sp.name, f"its nodes carry {len(labels)} GPU types ({', '.join(labels)}) and a site "
                                     f"partition has one" + (f"; they are also in {elsewhere}" if elsewhere else "")))
            continue
        gres_type = next(iter(types_here))
        kept.append(_partition(view, sp, gpu_nodes, gres_type, mapping, used_keys, types))
    for key in mapping:
        if key not in used_keys:
            raise SpecError("names no GRES type or partition that was read", field=f"--map {key}", found=key,
                            allowed="GRES types: " + (", ".join(sorted(gres_seen)) or "none") + "; partitions: " +
                                    ", ".join(p.name for p in kept))
    notes = list(_shared_nodes(view, kept))
    return Discovery(cluster=view.name, read_at=view.read_at, partitions=tuple(kept), skipped=tuple(skipped),
                     notes=tuple(notes), site_types=site_types, name=name or view.name)


def _node_type(n: SlurmNode) -> str | None:
    types = {g.type for g in n.gpus}
    return "+" if len(types) > 1 else next(iter(types))


def _elsewhere(view: ClusterView, here: str, nodes: list[SlurmNode]) -> str:
    others = sorted({p for n in nodes for p in n.partitions if p != here})
    return ", ".join(others)


def _partition(view, sp, gpu_nodes: list[SlurmNode], gres_type: str | None, mapping: dict[str, str],
               used_keys: set[str], types: tuple[GpuType, ...]) -> DiscoveredPartition:
    counts = Counter(sum(g.count for g in n.gpus) for n in gpu_nodes)
    # nodes of one partition with different GPU counts: the count that gives the most GPUs
    per_node = max(counts, key=lambda c: (c * counts[c], c))
    chosen = [n for n in gpu_nodes if sum(g.count for g in n.gpus) == per_node]
    notes = []
    if len(counts) > 1:
        left = {c: k for c, k in counts.items() if c != per_node}
        notes.append("left out " + ", ".join(f"{_plural(k, 'node')} with {c} GPUs" for c, k in sorted(left.items())) +
                     f" (a site partition has one GPU count per node; {_plural(len(chosen), 'node')} have {per_node})")
    others = len(view.nodes_of(sp.name)) - len(gpu_nodes)
    if others:
        notes.append(f"left out {_plural(others, 'node')} without GPUs")
    if sp.name in mapping:
        used_keys.add(sp.name)
        match = GpuMatch(gres_type=gres_type, gpu_type=mapping[sp.name], how=f"--map {sp.name}")
    elif gres_type is not None and gres_type in mapping:
        used_keys.add(gres_type)
        match = GpuMatch(gres_type=gres_type, gpu_type=mapping[gres_type], how=f"--map {gres_type}")
    else:
        feats = sorted(set.intersection(*(set(n.features) for n in chosen))) if chosen else []
        match = match_gpu(gres_type, types, features=feats)
    cpus = min(n.cpus for n in chosen)
    mem = min(n.real_memory_mib for n in chosen)
    held = view.reserved_nodes()
    states = Counter("reserved" if n.name in held and n.verdict().usable else n.condition for n in chosen)
    feats_all = tuple(sorted(set.intersection(*(set(n.features) for n in chosen)))) if chosen else ()
    return DiscoveredPartition(
        name=sp.name, match=match, gres_type=gres_type, nodes=len(chosen), gpus_per_node=per_node,
        cpus_per_task=max(1, cpus // per_node) if cpus else None, real_memory_mib=mem, max_time_min=sp.max_time_min,
        features=feats_all, states=tuple(sorted(states.items())), notes=tuple(notes))


def _shared_nodes(view: ClusterView, kept: list[DiscoveredPartition]) -> Iterable[str]:
    """Partitions of the site that share nodes: the search counts each one's nodes as its own."""
    sets = {p.name: {n.name for n in view.nodes_of(p.name)} for p in kept}
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = sets[a] & sets[b]
            if common:
                yield (f"partitions {a} and {b} share {_plural(len(common), 'node')}: a plan on both may count "
                       f"them twice; keep one (--partition) if they are the same hardware")


# --------------------------------------------------------------------------- the file


def _q(value: str) -> str:
    """A YAML scalar for a name: plain when it reads back as the same string, else quoted."""
    try:
        back = parse_yaml(f"k: {value}\n")
    except SpecError:
        back = None
    return value if isinstance(back, dict) and back.get("k") == value else json.dumps(value)


def _line(text: str, comment: str = "", width: int = 34) -> str:
    return f"{text:<{width}} # {comment}" if comment else text


def _write(d: Discovery) -> str:
    vendors = d.vendors()
    when = d.read_at.isoformat(timespec="seconds")
    out = [f"# Site read from Slurm cluster {d.cluster} by 'memx-hpc site discover' at {when}.",
           "# From Slurm: partitions, node counts and states, GRES type and count per node, CPUs, memory,",
           "# features. Not known to Slurm and written as labelled defaults: the link bandwidths (until",
           "# 'memx-hpc profile --links' measures them) and each partition's python and megatron_entry.",
           "# GPU types:"]
    for p in d.partitions:
        alts = p.match.alternatives
        alt = (f"; the name also fits {', '.join(alts)}: --map {p.gres_type or p.name}={alts[0]} if these are "
               "those") if alts else ""
        out.append(f"#   {p.name}: gpu:{p.gres_type or '(untyped)'} -> {p.gpu_type}, {p.match.how}{alt}")
    for n, why in d.skipped:
        out.append(f"# left out: {n}: {why}")
    for note in d.notes:
        out.append(f"# note: {note}")
    limits = [p.max_time_min for p in d.partitions if p.max_time_min is not None]
    out += [f"name: {_q(d.name)}",
            "slurm:",
            "  scheduler: slurm",
            _line(f"  time_limit_min: {DEFAULT_TIME_LIMIT_MIN}",
                  "default for rendered jobs" + (f"; partitions allow up to {min(limits)}" if limits else "")),
            "  # account: ...                  # the Slurm account to charge, where the cluster needs one",
            "store: memx-store.h5",
            "work_dir: memx-runs",
            "memory_safety_margin: 0.05",
            _line(f"inter_partition_gbytes_per_s: {DEFAULT_INTER_PARTITION_GBPS}",
                  "default, not measured: GB/s per direction between partitions")]
    if len(vendors) > 1:
        out += ["pipeline_comm:",
                _line("  backend: ucc", f"the partitions span vendors ({', '.join(vendors)}): groups across them "
                                        "use UCC or gloo")]
    if d.site_types:
        out.append("gpu_types:")
        for g in d.site_types:
            if g.name in {p.gpu_type for p in d.partitions}:
                out += _gpu_type_lines(g)
    out.append("partitions:")
    for p in d.partitions:
        g = d.gpu(p.gpu_type)
        states = ", ".join(f"{k} {w}" for w, k in p.states)
        out += [f"  - name: {_q(p.name)}",
                _line(f"    gpu_type: {_q(p.gpu_type)}", p.match.how)]
        if p.gres_type is not None:
            out.append(f"    gres_type: {_q(p.gres_type)}")
        out += [_line(f"    nodes: {p.nodes}", f"now: {states}"),
                f"    gpus_per_node: {p.gpus_per_node}"]
        if p.cpus_per_task is not None:
            out.append(_line(f"    cpus_per_task: {p.cpus_per_task}",
                             f"the node's CPUs / its {p.gpus_per_node} GPUs"))
        if p.max_time_min is not None and p.max_time_min < DEFAULT_TIME_LIMIT_MIN:
            out.append(_line(f"    time_limit_min: {p.max_time_min}", "the partition's MaxTime"))
        # left unset, the planner labels the figure it uses 'generic' (a site-file figure would
        # read as the site's own word about its fabric)
        out.append(_line(f"    # inter_node_gbytes_per_s: {DEFAULT_INTER_NODE_GBPS}",
                         "default, not measured: GB/s per direction between nodes; unset, the generic "
                         "figure is used and labelled so"))
        out.append(f"    # intra_node_gbytes_per_s: the {g.name} catalog figure ({g.link_gbps:g} GB/s per direction) "
                   "until measured")
        if p.real_memory_mib > 1:
            out.append(f"    # host memory: RealMemory {p.real_memory_mib} MiB per node "
                       f"(mem_per_node_gib: {p.real_memory_mib / 1024:g} would request all of it)")
        if p.features:
            out.append(f"    # node features: {', '.join(p.features)}")
        for note in p.notes:
            out.append(f"    # {note}")
        out += [_line("    python: python3", "default: set the nodes' Python with torch and megatron-core"),
                _line("    megatron_entry: pretrain_gpt.py", "default: set the path of Megatron-LM's pretrain_gpt.py")]
    return "\n".join(out) + "\n"


def _gpu_type_lines(g: GpuType) -> list[str]:
    lines = [f"  {_q(g.name)}:", f"    vendor: {g.vendor}", f"    memory_gib: {g.memory_gib:g}",
             f"    peak_tflops_bf16: {g.peak_tflops_bf16:g}", f"    peak_tflops_fp32: {g.peak_tflops_fp32:g}",
             f"    hbm_gbytes_per_s: {g.hbm_gbps:g}", f"    link_gbytes_per_s: {g.link_gbps:g}"]
    if g.source:
        lines.append(f"    source: {json.dumps(g.source)}")
    if g.aliases:
        lines.append(f"    aliases: [{', '.join(_q(a) for a in g.aliases)}]")
    if g.chip:
        lines.append(f"    chip: {_q(g.chip)}")
    if g.tdp_w:
        lines.append(f"    tdp_w: {g.tdp_w:g}")
    if g.form_factor:
        lines.append(f"    form_factor: {g.form_factor}")
    if g.compute_capability is not None:
        lines.append(f'    compute_capability: "{g.compute_capability[0]}.{g.compute_capability[1]}"')
    if tuple(g.precisions) != ("bf16", "fp16", "fp32"):
        lines.append(f"    precisions: [{', '.join(g.precisions)}]")
    if g.measured_at_profile_time:
        lines.append("    measured_at_profile_time: true")
    return lines
