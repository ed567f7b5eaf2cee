"""The built-in GPU catalog and model presets, read from YAML data shipped in the package.

GPU models are data, not code: a new part is an entry in ``data/gpus.yaml`` or in a
site file's ``gpu_types:``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Iterator

from ..errors import SpecError
from .checks import _suggest
from .gpu import GpuType, check_gpu_names
from .model import MODEL_FIELD_KEYS, ModelSpec, model_from_fields
from .yamlio import _Reader, parse_yaml


@dataclass(frozen=True)
class Catalog:
    """GPU types by name; aliases (e.g. Cephalo's ``a100x80``, Sailor's ``GH-96``) resolve too."""

    types: tuple[GpuType, ...]

    def names(self) -> list[str]:
        return [g.name for g in self.types] + [a for g in self.types for a in g.aliases]

    def find(self, name: str) -> GpuType | None:
        for g in self.types:
            if g.name == name or name in g.aliases:
                return g
        low = name.lower()
        for g in self.types:
            if g.name.lower() == low or low in (a.lower() for a in g.aliases):
                return g
        return None

    def get(self, name: str) -> GpuType:
        g = self.find(name)
        if g is None:
            raise SpecError("unknown GPU type" + _suggest(name, self.names()), found=name,
                            allowed=", ".join(x.name for x in self.types))
        return g

    def __iter__(self) -> Iterator[GpuType]:
        return iter(self.types)


def _read(name: str) -> dict:
    text = resources.files("memx_hpc.data").joinpath(name).read_text(encoding="utf-8")
    return parse_yaml(text)


@functools.lru_cache(maxsize=1)
def catalog() -> Catalog:
    """The built-in catalog (read once; immutable)."""
    data = _read("gpus.yaml")
    types = tuple(GpuType.from_mapping(v, f"gpus.yaml:{k}", name=k) for k, v in data.items())
    check_gpu_names(types, "gpus.yaml")
    return Catalog(types)


@functools.lru_cache(maxsize=1)
def _preset_data() -> dict:
    return _read("models.yaml")


def model_presets() -> dict[str, ModelSpec]:
    """Model presets by name."""
    out = {}
    for name, d in _preset_data().items():
        d = {k: v for k, v in d.items() if k != "source"}
        r = _Reader({"name": name, **d}, f"models.yaml:{name}")
        out[name] = model_from_fields(r, path=r.path)
        r.finish(MODEL_FIELD_KEYS)
    return out


def preset(name: str) -> ModelSpec:
    p = model_presets()
    if name not in p:
        raise SpecError("unknown model preset" + _suggest(name, sorted(p)), found=name, allowed=", ".join(sorted(p)))
    return p[name]


def precision_notes(site, job, gpu_types=None) -> list[str]:
    """One line per GPU type of ``site`` (of ``gpu_types`` when given) whose matrix units
    cannot run ``job``'s precision natively (bf16 on Volta or Turing): what the planner
    assumes and what to use instead."""
    out = []
    for name in dict.fromkeys(p.gpu_type for p in site.partitions):
        if gpu_types is not None and name not in gpu_types:
            continue
        g = site.gpu(name)
        if g.native(job.precision):
            continue
        alt = next((x for x in ("bf16", "fp16") if g.native(x)), "fp32")
        out.append(f"{name} has no native {job.precision} units: modelled at its fp32 rate "
                   f"({g.peak_tflops_fp32:g} TFLOP/s, not {g.peak_tflops_bf16:g}); use 'precision: {alt}' in "
                   f"{job.source_file or 'the job file'} to plan with its {alt} tensor units")
    if getattr(job, "fp8", ""):
        names = [n for n in dict.fromkeys(p.gpu_type for p in site.partitions)
                 if gpu_types is None or n in gpu_types]
        without = [n for n in names if site.gpu(n).peak_tflops_fp8 <= 0]
        with_ = [n for n in names if n not in without]
        if without:
            out.append(f"fp8: {job.fp8}: {', '.join(without)} {'has' if len(without) == 1 else 'have'} no FP8 units "
                       f"(no fp8 rate in the catalog): plans leave their partitions out")
        if with_:
            out.append(f"fp8: {job.fp8}: FP8 layer times on {', '.join(with_)} are the 16-bit predictions scaled by "
                       f"the roofline's FP8 ratio (the catalog's fp8 rate for the linear GEMMs) until FP8 layers are "
                       f"profiled; each stage holds Transformer Engine's FP8 weight copies")
    return out
