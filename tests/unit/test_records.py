"""End-to-end records and the job codec they keep a job's shape in (memx_hpc.records)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from memx_hpc.errors import SpecError
from memx_hpc.records import E2ERecord, job_from_spec, job_to_spec, records_hash
from memx_hpc.spec import Checkpointing, LRSchedule, TrainData, load_job

ROOT = Path(__file__).resolve().parents[2]


def _job_with_every_section():
    job = dataclasses.replace(load_job(ROOT / "jobs" / "tiny-gpt.yaml"), source_file=None)
    return dataclasses.replace(
        job, lr_schedule=LRSchedule(lr=3e-4, min_lr=3e-5, decay_style="cosine", warmup_iters=2),
        checkpoint=Checkpointing(save_dir="/ck/run", load_dir="/ck/run", save_interval=5),
        data=TrainData(paths=("/data/mix_text_document",), tokenizer_type="GPT2BPETokenizer",
                       vocab_file="/tok/vocab.json", merge_file="/tok/merges.txt"))


@pytest.mark.parametrize("name", ["tiny-gpt", "llama2-7b", "gpt3-2.7b"])
def test_job_codec_round_trips_through_json(name):
    job = dataclasses.replace(load_job(ROOT / "jobs" / f"{name}.yaml"), source_file=None)
    assert job_from_spec(json.loads(json.dumps(job_to_spec(job)))) == job


def test_job_codec_keeps_data_schedule_and_checkpoint_sections():
    job = _job_with_every_section()
    back = job_from_spec(json.loads(json.dumps(job_to_spec(job))))
    assert back == job and isinstance(back.data, TrainData) and back.data.paths == ("/data/mix_text_document",)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(bogus=1), "job_spec"),
    (lambda d: d["model"].update(heads=8), "job_spec.model"),
    (lambda d: d["lr_schedule"].update(peak=1), "job_spec.lr_schedule"),
])
def test_job_codec_names_unknown_fields(mutate, field):
    d = job_to_spec(_job_with_every_section())
    mutate(d)
    with pytest.raises(SpecError) as e:
        job_from_spec(d)
    assert e.value.field == field


def test_records_hash_ignores_order_and_sees_every_value():
    base = dict(key="k", plan={"tp": 1}, site="s", job="j", iters=3, iteration_ms=10.0,
                peak_allocated_bytes={"0": 1}, peak_footprint_bytes_by_rank={"0": 2}, gpu_type_by_rank={"0": "g"},
                job_id="1", log_file="x")
    a, b = E2ERecord(**base), E2ERecord(**{**base, "job_id": "2"})
    assert records_hash([a, b]) == records_hash([b, a]) != records_hash([a])
    assert records_hash([dataclasses.replace(a, iteration_ms=10.5), b]) != records_hash([a, b])
