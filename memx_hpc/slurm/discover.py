"""What Slurm says about its hardware and its state: partitions, nodes, GRES, reservations.

Read from ``scontrol show node|partition|reservation --oneliner`` (one record per line,
``Key=value`` fields), the text every Slurm release since 2.x prints the same way, so a
login node needs no REST daemon and no JSON plugin. Parsing is pure (the functions take
the text); :func:`read_cluster` runs the clients.

The types say what the rest of the project needs and nothing of it: which partitions
exist and whether they are up, each node's GPUs (GRES name, type, count), CPUs, memory,
features and state, and which nodes a reservation holds now. :meth:`ClusterView.usable`
says which nodes of a partition a new job can be given: not down, drained or draining,
failing, in maintenance, not responding, or held by an active reservation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime

from ..errors import SystemFailure
from ..spec import MAX_GPUS_PER_NODE, MAX_NODES
from .bounded import bounded_run
from .local_cluster import parse_gres

__all__ = ["GresItem", "SlurmNode", "SlurmPartition", "Reservation", "ClusterView", "NodeVerdict",
           "parse_records", "parse_nodes", "parse_partitions", "parse_reservations", "parse_cluster_name",
           "parse_minutes", "parse_time", "expand_hostlist", "HostlistError", "read_cluster", "MAX_OUTPUT_BYTES"]

#: The most a Slurm client's answer may hold. ``scontrol show node --oneliner`` prints about
#: 1 KiB a node, so 64 MiB is some 60,000 nodes, past the largest clusters; a client that
#: prints more (or never stops) is stopped there, exit 2, rather than filling memory.
MAX_OUTPUT_BYTES = 64 * 2**20
#: The most node names one node list may expand to (counted before expanding it).
MAX_HOSTLIST_NAMES = MAX_NODES

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")
_NULL = ("", "(null)", "N/A", "n/a", "NONE", "None")

#: node state flags (``State=IDLE+DRAIN``) under which Slurm starts no new job on the node
UNUSABLE_FLAGS = {"DRAIN": "drained", "FAIL": "failing", "MAINT": "in maintenance",
                  "NOT_RESPONDING": "not responding", "INVAL": "invalid (its hardware differs from slurm.conf)",
                  "RESERVED": "reserved", "REBOOT_ISSUED": "rebooting", "POWERING_DOWN": "powering down"}
#: base node states under which no job starts
UNUSABLE_STATES = {"DOWN": "down", "FUTURE": "not yet in service (FUTURE)", "UNKNOWN": "not registered (UNKNOWN)",
                   "ERROR": "in error"}
#: sinfo-style suffixes that can trail a state word, and the flag each means
_STATE_SUFFIX = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                 "!": "POWER_DOWN", "$": "MAINT", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "-": "PLANNED"}


# --------------------------------------------------------------------------- text


def parse_records(text: str, key: str) -> list[dict[str, str]]:
    """The ``--oneliner`` records of ``text`` whose first field is ``key``: one dict per line.

    A value runs to the next `` Name=`` (values such as ``OS=Linux 6.1 #1 SMP`` hold spaces;
    ``CfgTRES=cpu=2,mem=6000M`` holds ``=`` after no space). Lines of another kind ("No
    reservations in the system") are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(f"{key}="):
            continue
        marks = list(_FIELD.finditer(line))
        rec: dict[str, str] = {}
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
            rec.setdefault(m.group(1), line[m.end():end].strip())
        out.append(rec)
    return out


def _null(value: str | None) -> bool:
    return value is None or value.strip() in _NULL


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


def _words(value: str | None) -> tuple[str, ...]:
    if _null(value):
        return ()
    return tuple(w for w in (x.strip() for x in str(value).split(",")) if w)


def parse_minutes(value: str | None) -> int | None:
    """A Slurm time limit in whole minutes; None for ``UNLIMITED``/``INFINITE``/``NONE``.

    Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` (seconds are
    rounded up: a limit is never shortened)."""
    if value is None:
        return None
    v = value.strip()
    if v.upper() in ("UNLIMITED", "INFINITE", "NONE", "", "(NULL)", "N/A"):
        return None
    days = 0
    if "-" in v:
        d, _, v = v.partition("-")
        days = int(d)
        parts = [int(x) for x in v.split(":")]
        h, m, s = (parts + [0, 0])[:3]
    else:
        parts = [int(x) for x in v.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts[:3]
    return days * 1440 + h * 60 + m + (1 if s > 0 else 0)


def parse_time(value: str | None) -> datetime | None:
    """A Slurm timestamp (``2026-12-01T21:38:51``, the controller's local time as the client
    prints it) as an aware datetime in this machine's time zone; None for ``Unknown``/``N/A``."""
    if _null(value) or str(value).strip().lower() in ("unknown", "none"):
        return None
    try:
        return datetime.fromisoformat(str(value).strip()).astimezone()
    except ValueError:
        return None


class HostlistError(SystemFailure, ValueError):
    """A node list that is not Slurm's syntax, or names more nodes than :data:`MAX_HOSTLIST_NAMES`.
    :func:`read_cluster` adds which client's answer held it."""


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """Slurm's hostlist syntax: ``gpu[001-003,7],login1`` -> ``gpu001 gpu002 gpu003 gpu7 login1``;
    several bracket groups in one name expand as a product (``r[1-2]n[1-2]``).

    HostlistError for a range that is not numbers (``[x-y]``) or a list that would expand past
    :data:`MAX_HOSTLIST_NAMES` names (counted first: ``n[0-99][0-99][0-99][0-99][0-99]`` is
    refused without building its 10^10 names)."""
    expr = (expr or "").strip()
    if _null(expr):
        return ()
    words: list[str] = []
    depth, start = 0, 0
    for i, c in enumerate(expr + ","):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            word = expr[start:i].strip()
            if word:
                words.append(word)
            start = i + 1
    total = 0
    for word in words:
        total += _count_one(word, expr)
        if total > MAX_HOSTLIST_NAMES:
            raise HostlistError(f"node list {_short(expr)} names more than {MAX_HOSTLIST_NAMES:,} nodes")
    names: list[str] = []
    for word in words:
        names.extend(_expand_one(word, expr))
    return tuple(dict.fromkeys(names))


def _short(expr: str) -> str:
    return repr(expr if len(expr) <= 80 else expr[:77] + "...")


def _ranges(group: str, expr: str) -> list[tuple[str, int, int] | str]:
    """The parts of one bracket group: ``(first, lo, hi)`` for a range, the text otherwise."""
    out: list[tuple[str, int, int] | str] = []
    for part in group.split(","):
        part = part.strip()
        if "-" in part:
            a, _, b = part.partition("-")
            if not (a.isdigit() and b.isdigit()) or len(a) > 18 or len(b) > 18:
                raise HostlistError(f"node list {_short(expr)}: {part!r} is not a range of numbers")
            lo, hi = int(a), int(b)
            if hi < lo:
                raise HostlistError(f"node list {_short(expr)}: the range {part!r} runs backwards")
            out.append((a, lo, hi))
        elif part:
            out.append(part)
    return out


def _count_one(word: str, expr: str) -> int:
    n = 1
    for group in re.findall(r"\[([^\]]*)\]", word):
        n *= sum(p[2] - p[1] + 1 if isinstance(p, tuple) else 1 for p in _ranges(group, expr))
        if n > MAX_HOSTLIST_NAMES:
            return n
    return n


def _expand_one(word: str, expr: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", word)
    if m is None:
        return [word]
    head, tail = word[:m.start()], word[m.end():]
    out = []
    for part in _ranges(m.group(1), expr):
        if isinstance(part, tuple):
            a, lo, hi = part
            width = len(a) if a.startswith("0") else 0
            for k in range(lo, hi + 1):
                out.extend(_expand_one(f"{head}{k:0{width}d}{tail}", expr))
        else:
            out.extend(_expand_one(f"{head}{part}{tail}", expr))
    return out


# --------------------------------------------------------------------------- types


@dataclass(frozen=True, kw_only=True)
class GresItem:
    """One generic resource of a node: ``gpu:a100:4`` is name ``gpu``, type ``a100``, count 4."""

    name: str
    type: str | None
    count: int

    @staticmethod
    def parse(item: str) -> "GresItem | None":
        parts = item.split(":")
        if not parts[0]:
            return None
        if len(parts) >= 3:
            gtype, count = parts[1], parts[2]
        elif len(parts) == 2:
            gtype, count = (None, parts[1]) if parts[1].isdigit() else (parts[1], "1")
        else:
            gtype, count = None, "1"
        n = _int(count, -1)
        if n < 0:
            return None
        return GresItem(name=parts[0], type=gtype or None, count=n)

    def label(self) -> str:
        return ":".join([self.name] + ([self.type] if self.type else []) + [str(self.count)])


@dataclass(frozen=True, kw_only=True)
class NodeVerdict:
    """Whether a new job can be given a node now, and if not, why (in words)."""

    usable: bool
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class SlurmNode:
    """A node as ``scontrol show node`` reports it. ``state``: the base state (``IDLE``,
    ``MIXED``, ``ALLOCATED``, ``DOWN`` ...); ``flags``: what follows it (``DRAIN``,
    ``NOT_RESPONDING`` ...). ``cpus``: the CPUs jobs can use (CPUEfctv, else CPUTot);
    ``real_memory_mib``: RealMemory (Slurm's MB are MiB)."""

    name: str
    partitions: tuple[str, ...]
    state: str
    flags: tuple[str, ...] = ()
    cpus: int = 0
    real_memory_mib: int = 0
    gres: tuple[GresItem, ...] = ()
    features: tuple[str, ...] = ()
    reason: str = ""
    #: ``gpu`` GRES items whose count is not a whole number up to MAX_GPUS_PER_NODE, as Slurm printed them
    bad_gpus: tuple[str, ...] = ()

    @property
    def gpus(self) -> tuple[GresItem, ...]:
        """The node's ``gpu`` GRES (one entry per type)."""
        return tuple(g for g in self.gres if g.name == "gpu" and g.count > 0)

    @property
    def busy(self) -> bool:
        """Running jobs on it now (a new job may wait for them)."""
        return self.state in ("ALLOCATED", "MIXED", "COMPLETING") or "COMPLETING" in self.flags

    def verdict(self, reserved_by: str | None = None) -> NodeVerdict:
        """Whether Slurm would give this node to a new job (``reserved_by``: the active
        reservation that holds it, if any)."""
        if self.state in UNUSABLE_STATES:
            return NodeVerdict(usable=False, why=UNUSABLE_STATES[self.state])
        for f in self.flags:
            if f in UNUSABLE_FLAGS:
                why = UNUSABLE_FLAGS[f]
                if f == "DRAIN" and self.busy:
                    why = "draining (its running jobs finish, no new one starts)"
                return NodeVerdict(usable=False, why=why + (f": {self.reason}" if self.reason else ""))
        if reserved_by is not None:
            return NodeVerdict(usable=False, why=f"held by reservation {reserved_by}")
        return NodeVerdict(usable=True)

    @property
    def condition(self) -> str:
        """One word for reports: idle, busy, drained, down, ... (reservations not counted)."""
        v = self.verdict()
        if not v.usable:
            return v.why.split(":")[0].split(" (")[0]
        return "busy" if self.busy else "idle"


def _state(text: str) -> tuple[str, tuple[str, ...]]:
    words = [w for w in (text or "UNKNOWN").upper().split("+") if w]
    flags: list[str] = []
    base = words[0] if words else "UNKNOWN"
    while base and base[-1] in _STATE_SUFFIX:
        flags.append(_STATE_SUFFIX[base[-1]])
        base = base[:-1]
    flags += [w.rstrip("".join(_STATE_SUFFIX)) for w in words[1:]]
    if base in ("DRAINED", "DRAINING"):  # sinfo's words, should they appear
        base, flags = ("IDLE" if base == "DRAINED" else "MIXED"), flags + ["DRAIN"]
    return base, tuple(dict.fromkeys(flags))


def parse_nodes(text: str) -> tuple[SlurmNode, ...]:
    """``scontrol show node --oneliner`` -> nodes."""
    out = []
    for r in parse_records(text, "NodeName"):
        state, flags = _state(r.get("State", ""))
        items = parse_gres(r.get("Gres", ""))
        parsed = [GresItem.parse(i) for i in items]
        bad = tuple(i for i, g in zip(items, parsed) if i.split(":")[0] == "gpu" and
                    (g is None or g.count > MAX_GPUS_PER_NODE))
        gres = tuple(g for i, g in zip(items, parsed) if g is not None and i not in bad)
        cpus = _int(r.get("CPUEfctv"), 0) or _int(r.get("CPUTot"), 0)
        out.append(SlurmNode(
            name=r["NodeName"], partitions=_words(r.get("Partitions")), state=state, flags=flags, cpus=cpus,
            real_memory_mib=_int(r.get("RealMemory"), 0), gres=gres,
            features=_words(r.get("AvailableFeatures")), reason="" if _null(r.get("Reason")) else r["Reason"],
            bad_gpus=bad))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class SlurmPartition:
    """A partition as ``scontrol show partition`` reports it (``state``: UP, DOWN, DRAIN,
    INACTIVE; ``max_time_min`` None: unlimited)."""

    name: str
    state: str = "UP"
    default: bool = False
    hidden: bool = False
    max_time_min: int | None = None
    total_nodes: int = 0
    node_names: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        return self.state == "UP"


def parse_partitions(text: str) -> tuple[SlurmPartition, ...]:
    """``scontrol show partition --oneliner`` -> partitions."""
    out = []
    for r in parse_records(text, "PartitionName"):
        try:
            max_time = parse_minutes(r.get("MaxTime"))
        except ValueError:
            max_time = None
        out.append(SlurmPartition(
            name=r["PartitionName"], state=(r.get("State") or "UP").upper(), default=r.get("Default") == "YES",
            hidden=r.get("Hidden") == "YES", max_time_min=max_time, total_nodes=_int(r.get("TotalNodes"), 0),
            node_names=expand_hostlist(r.get("Nodes", ""))))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Reservation:
    """An advance reservation: the nodes it holds from ``start`` to ``end``."""

    name: str
    start: datetime | None
    end: datetime | None
    node_names: tuple[str, ...]
    state: str = ""
    flags: tuple[str, ...] = ()

    def active_at(self, when: datetime) -> bool:
        if self.state == "ACTIVE":
            return self.end is None or when < self.end
        return self.start is not None and self.start <= when and (self.end is None or when < self.end)


def parse_reservations(text: str) -> tuple[Reservation, ...]:
    """``scontrol show reservation --oneliner`` -> reservations ("No reservations in the
    system" -> none)."""
    return tuple(Reservation(name=r["ReservationName"], start=parse_time(r.get("StartTime")),
                             end=parse_time(r.get("EndTime")), node_names=expand_hostlist(r.get("Nodes", "")),
                             state=(r.get("State") or "").upper(), flags=_words(r.get("Flags")))
                 for r in parse_records(text, "ReservationName"))


def parse_cluster_name(text: str) -> str | None:
    """``ClusterName`` from ``scontrol show config`` (``ClusterName = memx``)."""
    m = re.search(r"^ClusterName\s*=\s*(\S+)\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


# --------------------------------------------------------------------------- the view


@dataclass(frozen=True, kw_only=True)
class ClusterView:
    """Everything read from Slurm at ``read_at``: partitions in Slurm's order, nodes, reservations."""

    name: str
    partitions: tuple[SlurmPartition, ...]
    nodes: tuple[SlurmNode, ...]
    reservations: tuple[Reservation, ...] = ()
    read_at: datetime = field(default_factory=lambda: datetime.now().astimezone())

    def partition(self, name: str) -> SlurmPartition | None:
        return next((p for p in self.partitions if p.name == name), None)

    def nodes_of(self, partition: str) -> tuple[SlurmNode, ...]:
        """The nodes of a partition, in Slurm's node order."""
        p = self.partition(partition)
        listed = set(p.node_names) if p is not None else set()
        return tuple(n for n in self.nodes if partition in n.partitions or n.name in listed)

    def reserved_nodes(self, when: datetime | None = None) -> dict[str, str]:
        """Node -> the reservation holding it at ``when`` (default: when the view was read)."""
        when = when or self.read_at
        out: dict[str, str] = {}
        for r in self.reservations:
            if r.active_at(when):
                for n in r.node_names:
                    out.setdefault(n, r.name)
        return out

    def verdicts(self, partition: str) -> tuple[tuple[SlurmNode, NodeVerdict], ...]:
        """Each node of the partition with whether a new job can have it (a partition that is
        not UP gives none of its nodes)."""
        p = self.partition(partition)
        held = self.reserved_nodes()
        out = []
        for n in self.nodes_of(partition):
            if p is not None and not p.up:
                out.append((n, NodeVerdict(usable=False, why=f"partition {partition} is {p.state}")))
            else:
                out.append((n, n.verdict(held.get(n.name))))
        return tuple(out)

    def usable(self, partition: str) -> tuple[SlurmNode, ...]:
        """The nodes of the partition a new job can be given now."""
        return tuple(n for n, v in self.verdicts(partition) if v.usable)


def _scontrol(args: list[str], timeout_s: float) -> str:
    exe = shutil.which("scontrol")
    if exe is None:
        raise SystemFailure("scontrol is not on PATH: reading the cluster needs Slurm's client commands")
    try:
        rc, out, err = bounded_run([exe, *args], timeout_s, MAX_OUTPUT_BYTES)
    except OSError as e:
        raise SystemFailure(f"could not run scontrol: {e}") from None
    # Slurm passes node Reasons and comments through as the admin typed them (Latin-1
    # and all): a byte that is not UTF-8 becomes U+FFFD rather than a failure
    stdout, stderr = out.decode("utf-8", errors="replace"), err.decode("utf-8", errors="replace")
    if rc != 0:
        raise SystemFailure(f"scontrol {' '.join(args)} failed (exit {rc}): {(stderr or stdout).strip()[:2000]}")
    return stdout


def _read(parse, args: list[str], timeout_s: float):
    """``parse`` of ``scontrol ARGS``'s answer; a node list in it that cannot be read names
    the command it came from."""
    text = _scontrol(args, timeout_s)
    try:
        return parse(text)
    except HostlistError as e:
        raise SystemFailure(f"{e} (in the answer of scontrol {' '.join(args)})") from None


def read_cluster(*, timeout_s: float = 20.0) -> ClusterView:
    """Ask Slurm (``scontrol``) for its partitions, nodes, reservations and cluster name.
    SystemFailure (exit 2) when the client is missing, fails, does not answer, answers more
    than :data:`MAX_OUTPUT_BYTES` or with a node list that cannot be read."""
    read_at = datetime.now().astimezone()
    nodes = _read(parse_nodes, ["show", "node", "--oneliner"], timeout_s)
    parts = _read(parse_partitions, ["show", "partition", "--oneliner"], timeout_s)
    res = _read(parse_reservations, ["show", "reservation", "--oneliner"], timeout_s)
    name = parse_cluster_name(_scontrol(["show", "config"], timeout_s)) or "slurm"
    if not parts:
        raise SystemFailure("scontrol show partition lists no partitions")
    return ClusterView(name=name, partitions=parts, nodes=nodes, reservations=res, read_at=read_at)
