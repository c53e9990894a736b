"""The deep-trace request channel as a trainer sees it (``src/whyidle/instrument/trace_requests.py``,
shared by the PyTorch and the Keras/TensorFlow windows): one ``stat`` per look, a read only on a
change, each ``id`` served once, requests older than the process and those naming other
processes left alone."""

from __future__ import annotations

import json
import os
import time

import pytest

from whyidle.instrument import trace_requests
from whyidle.instrument.trace_requests import MAX_STEPS, Requests, steps_of, trace_name


def write(run_dir, **fields):
    os.makedirs(os.path.join(run_dir, "control"), exist_ok=True)
    req = {"id": "t1", "steps": 3, "ranks": None, "pids": None, "reason": "test", "t": time.monotonic_ns(), **fields}
    path = os.path.join(run_dir, "control", "trace.json")
    with open(path + ".tmp", "w") as f:
        json.dump(req, f)
    os.replace(path + ".tmp", path)
    return path


def test_a_request_is_read_once_per_change_and_served_once(tmp_path, monkeypatch):
    reqs = Requests(str(tmp_path), time.monotonic_ns() - 1)
    assert reqs.look() is None  # no control file yet
    path = write(tmp_path, id="a")
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    req = reqs.look()
    assert req["id"] == "a" and opened == [path]
    assert reqs.look() is None and opened == [path]  # unchanged: a stat, no read
    assert reqs.serve(req) == 3
    os.utime(path, ns=(1, 1))  # looks changed, same id: read, not served again
    assert reqs.look() is None and len(opened) == 2
    write(tmp_path, id="b")
    assert reqs.look()["id"] == "b"


@pytest.mark.parametrize("fields, served", [
    ({"pids": [1]}, False),  # another process
    ({"pids": "all"}, False),
    ({"ranks": [1]}, False),  # outside a distributed job this process is rank 0
    ({"ranks": [0, 1]}, True),
    ({"t": 0}, False),  # written before this process started
    ({"id": ""}, False),
    ({"id": 7}, False),
])
def test_a_request_names_the_processes_that_serve_it(tmp_path, fields, served):
    write(tmp_path, **fields)
    reqs = Requests(str(tmp_path), time.monotonic_ns() - 10**9, place=lambda: (None, None))
    assert (reqs.look() is not None) == served


def test_the_rank_comes_from_the_place_and_else_the_launcher(tmp_path, monkeypatch):
    write(tmp_path, ranks=[2])
    assert Requests(str(tmp_path), 0, place=lambda: (2, 4)).look() is not None
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert trace_requests.launcher_place() == (2, 4)
    assert Requests(str(tmp_path), 0).look() is not None
    monkeypatch.setenv("RANK", "1")
    assert Requests(str(tmp_path), 0).look() is None


def test_a_half_written_file_is_read_again_at_its_next_change(tmp_path):
    path = os.path.join(tmp_path, "control", "trace.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write('{"id": "t1", "st')
    reqs = Requests(str(tmp_path), 0)
    assert reqs.look() is None
    write(tmp_path)
    assert reqs.look()["id"] == "t1"


def test_steps_and_names():
    assert steps_of({"steps": 5}) == 5
    assert steps_of({"steps": 10_000}) == MAX_STEPS
    assert steps_of({"steps": 0}) == steps_of({"steps": True}) == steps_of({}) == trace_requests.DEFAULT_STEPS
    assert trace_name("a/b c", None, 12) == "a_b_c-12"
    assert trace_name("x" * 100, 3, 12) == "x" * 64 + "-rank3-12"
