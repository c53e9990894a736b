"""Issue 36's scenarios end to end: inside a multi-worker DataLoader, which part holds the wait
(head-of-line blocking, the training process's own receiving or snapshots, uneven IterableDataset
shards, a per-sample collate run in the loop), each faulty run diagnosed under whyidle and its
fixed variant measured. Ratios are asserted loosely (a shared 2-core box); the measured figures
are in tests/scenarios/README.md."""

from __future__ import annotations

import pytest

from conftest import finding
from test_scenarios import scenario, sps

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def close(estimate: float, measured: float) -> bool:
    """The estimate within 45 % of the measured ratio (the issue's goal is 30 %, measured quietly in
    the README's table; one run on a loaded box spreads more)."""
    return 1 / 1.45 <= estimate / measured <= 1.45


def workers_advised(f: dict) -> bool:
    """A fix option changes num_workers (its text says so, or a line of its code does)."""
    return any("Raise num_workers" in o["text"]
               or any("num_workers=" in line and "# was" in line for line in (o["code"] or "").splitlines())
               for o in f["fix"]["options"])


def test_head_of_line_blocking(tmp_path):
    faulty = scenario(tmp_path, "loader_head_of_line.py")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "head_of_line"
    first = f["fix"]["options"][0]
    assert "in_order=False" in first["text"] and not workers_advised(f)
    fixed = scenario(tmp_path, "loader_head_of_line.py", "--variant", "fixed")
    assert close(first["est_speedup"], sps(fixed) / sps(faulty)), (first["est_speedup"], sps(fixed) / sps(faulty))


def test_receiving_python_lists_names_the_training_process(tmp_path):
    faulty = scenario(tmp_path, "lists_unpickle.py")
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "main_process_receive" and not workers_advised(f)
    assert faulty["verdict"] in ("host_bound", "input_bound")  # the tensor conversion in the loop, or the receiving
    fixed = scenario(tmp_path, "lists_unpickle.py", "--variant", "fixed")
    assert sps(fixed) >= 1.5 * sps(faulty)


def test_uneven_iterable_shards(tmp_path):
    faulty = scenario(tmp_path, "iterable_uneven.py")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "uneven_shards" and not workers_advised(f)
    fixed = scenario(tmp_path, "iterable_uneven.py", "--variant", "fixed")
    assert close(f["est_speedup"], sps(fixed) / sps(faulty)), (f["est_speedup"], sps(fixed) / sps(faulty))


def test_stateful_dataloader_snapshotting_every_step(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    faulty = scenario(tmp_path, "stateful_snapshot.py")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "main_process_receive" and "snapshot_every_n_steps" in f["fix"]["text"]
    assert not workers_advised(f)
    smells = finding(faulty, "input_pipeline_config")["evidence"]["smells"]
    assert any("snapshot_every_n_steps=1" in s for s in smells)
    fixed = scenario(tmp_path, "stateful_snapshot.py", "--variant", "fixed")
    assert close(f["est_speedup"], sps(fixed) / sps(faulty)), (f["est_speedup"], sps(fixed) / sps(faulty))


def test_collate_in_the_loop_names_the_training_process(tmp_path):
    faulty = scenario(tmp_path, "collate_in_loop.py")
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    assert "pad_batch" in f["summary"]
    assert all(not workers_advised(g) for g in faulty["findings"] if g["id"] == "input_bound")
    fixed = scenario(tmp_path, "collate_in_loop.py", "--variant", "fixed")
    assert sps(fixed) >= 1.3 * sps(faulty)
