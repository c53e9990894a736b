"""The typed parts of :class:`whyidle.analysis.facts.RunFacts` hold exactly the keys their builders
return, on recorded runs (tests/data/runs: PyTorch and Keras on a CPU) and on a synthetic run with
a GPU (tests/synthetic_run.py): a key added to a builder and not to its type, or the reverse,
fails here."""

from __future__ import annotations

import dataclasses
import os
import typing

import pytest

import synthetic_run
from whyidle.analysis import facts as F
from whyidle.analysis.run import analyze
from whyidle.record.reader import load_run

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "runs")

#: RunFacts field → its TypedDict.
TYPED = {"step": F.StepMetrics, "host": F.HostMetrics, "gpu": F.GpuMetrics, "device": F.DeviceInfo,
         "api": F.TrainingApi, "loader_iters": F.LoaderIters, "input_wait": F.InputWait, "time": F.TimeAccounting,
         "notebook": F.NotebookFacts, "worker_start": F.WorkerStart}


def check(facts: F.RunFacts) -> set[str]:
    """Asserts each typed part's keys; returns the names of the parts that were present."""
    seen = set()
    for name, typed in TYPED.items():
        value = getattr(facts, name)
        if value is None:
            continue
        seen.add(name)
        keys = set(value)
        assert typed.__required_keys__ <= keys, (name, sorted(typed.__required_keys__ - keys))
        assert keys <= typed.__required_keys__ | typed.__optional_keys__, (name, sorted(keys - set(typing.get_type_hints(typed))))
        if name == "time":  # and each part
            for part in value["parts"].values():
                assert set(part) == F.TimePart.__required_keys__, sorted(part)
    return seen


def test_every_typed_field_is_declared_with_its_type():
    hints = typing.get_type_hints(F.RunFacts)
    for name, typed in TYPED.items():
        assert hints[name] == typed | None, name
    assert {f.name for f in dataclasses.fields(F.RunFacts)} >= set(TYPED)


@pytest.mark.parametrize("name", sorted(os.listdir(RUNS)))
def test_recorded_runs_parts_match_their_types(name):
    seen = check(analyze(load_run(os.path.join(RUNS, name))))
    assert {"step", "host", "device", "api", "loader_iters", "time"} <= seen
    if name.startswith("keras"):
        assert "input_wait" in seen


def test_gpu_run_parts_match_their_types(tmp_path):
    run_dir = synthetic_run.write_run(tmp_path / "run", steps=30, gpu=True)
    facts = analyze(load_run(run_dir))
    assert {"step", "host", "gpu", "device"} <= check(facts)
    assert facts.device["kind"] == "cuda" and facts.device["count"] == 1
