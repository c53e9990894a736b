"""The Kineto reader's byte-range split (several processes) and its decoder-checked fast path give
the columns of the single-process, per-event-checked read: on synthetic traces split at small
sizes (fast tier), and on every trace of ../shared/traces (slow; skipped when that folder is
absent), where the GPU idle share must agree within 0.01 percentage points (issue 35)."""

from __future__ import annotations

import glob
import gzip
import json
import os

import msgspec
import numpy as np
import pytest
from test_trace_cli import SHARED_TRACES, needs_shared, synthetic_trace

from whyidle.analysis.trace import rank_metrics
from whyidle.record import kineto, kineto_events
from whyidle.record.trace_data import MEMSET


def columns(t) -> dict:
    """Every column of a TraceData with names as strings, the string table and the scalars."""
    out = {}
    for g in ("gpu", "runtime", "cpu", "syncs"):
        for k, v in getattr(t, g).items():
            out[f"{g}.{k}"] = [t.strings[i] for i in v] if k in ("name", "cat") else v.tolist()
    out.update(strings=t.strings, steps=t.steps, events=t.events, skipped=t.skipped, cut=t.cut,
               pageable=t.pageable.tolist(), meta=(t.rank, t.world_size, t.backend, t.base_ns))
    return out


def force_split(monkeypatch) -> None:
    """Split any file, however small, into as many ranges as workers are asked for."""
    monkeypatch.setattr(kineto, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(kineto, "MIN_PART_BYTES", 1)


def ranges(path: str, workers: int) -> list[int]:
    with open(path, "rb") as f:
        _head, _buf, a0 = kineto._find_array(f, 1 << 16, path)
    return kineto._split_points(path, a0, workers)


def mixed_trace(steps: int = 40) -> dict:
    """A synthetic trace with every event group: kernels, a memcpy, a memset, runtime calls on two
    threads (one named, not a number), CPU ops, cuda_sync events, flows, a missing name and ts."""
    doc = synthetic_trace(steps=steps, pageable=True)
    ev = doc["traceEvents"]
    t0 = min(e["ts"] for e in ev if "ts" in e)
    extra = []
    for i in range(steps):
        ts = t0 + i * 10_000
        extra += [
            {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": ts + 1, "dur": 2,
             "args": {"device": 0, "stream": 7, "correlation": 900_000 + i, "bytes": 4096}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync", "pid": 1, "tid": "loader thread",
             "ts": ts, "dur": 1, "args": {"correlation": 900_000 + i}},
            {"ph": "X", "cat": "cuda_sync", "name": "cudaStreamSynchronize", "pid": 0, "tid": 7, "ts": ts + 3,
             "dur": 5, "args": {"cuda_sync_kind": "Stream Sync", "stream": 7}},
            {"ph": "s", "cat": "ac2g", "id": i, "pid": 1, "tid": 1, "ts": ts, "name": "flow"},
            {"ph": "X", "cat": "user_annotation", "pid": 1, "tid": "12", "ts": ts + 4, "dur": 1},
            {"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1},
        ]
    doc["traceEvents"] = ev + extra
    return doc


def write(path, doc) -> str:
    path.write_bytes(json.dumps(doc).encode())
    return str(path)


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_byte_range_split_gives_the_single_process_columns(tmp_path, monkeypatch, workers):
    path = write(tmp_path / "t.json", mixed_trace())
    force_split(monkeypatch)
    assert len(ranges(path, workers)) == workers - 1  # really split
    one = kineto.read_trace(path, workers=1, block_bytes=4096)
    many = kineto.read_trace(path, workers=workers, block_bytes=4096)
    assert columns(many) == columns(one)
    assert len(one.syncs["ts"]) and len(one.runtime["ts"]) and (one.gpu["kind"] == MEMSET).any()
    assert rank_metrics(many) == rank_metrics(one)


def test_the_decoder_checked_path_equals_the_per_event_checks(tmp_path, monkeypatch):
    """Blocks decoded into the checked structs and blocks checked event by event (the path taken
    when any field falls outside the decoder's checks) give the same columns, strings in the same
    order and the same thread ids."""
    doc = mixed_trace()
    path = write(tmp_path / "t.json", doc)
    assert len(kineto._FAST_DECODER.decode(json.dumps(doc["traceEvents"]))) == len(doc["traceEvents"])
    fast = kineto.read_trace(path, block_bytes=2048)

    class Refuse:
        def decode(self, _text):
            raise msgspec.ValidationError("refused")

    monkeypatch.setattr(kineto, "_FAST_DECODER", Refuse())
    checked = kineto.read_trace(path, block_bytes=2048)
    assert columns(fast) == columns(checked)
    assert -1 in fast.runtime["tid"]  # the named thread got a stable negative id


def test_a_mistyped_event_of_another_phase_is_counted_as_before(tmp_path, monkeypatch):
    """An instant or flow event with a string ts or a numeric name is left out and counted by the
    decoder-checked path as by the per-event checks; an X event's ts out of range too."""
    doc = mixed_trace(steps=10)
    ev = doc["traceEvents"]
    ev.append({"ph": "i", "name": "marker", "ts": "soon", "pid": 1, "tid": 1})
    ev.append({"ph": "f", "name": 5, "cat": "ac2g", "ts": 1, "id": 1, "pid": 1, "tid": 1})
    ev.append({"ph": "X", "name": "far", "cat": "cpu_op", "ts": 1e18, "dur": 1, "pid": 1, "tid": 1})
    path = write(tmp_path / "t.json", doc)
    fast = kineto.read_trace(path)

    class Refuse:
        def decode(self, _text):
            raise msgspec.ValidationError("refused")

    monkeypatch.setattr(kineto, "_FAST_DECODER", Refuse())
    assert columns(fast) == columns(kineto.read_trace(path))
    assert fast.skipped == 3


def test_an_unusable_field_in_one_range_is_left_out_as_in_one_process(tmp_path, monkeypatch):
    """A negative duration, a string ts and a 2^70 stream in the middle of a split file: each
    range's decoder-checked path falls back to the per-event checks, with the counts of one
    process."""
    doc = mixed_trace()
    ev = doc["traceEvents"]
    ev[len(ev) // 2]["dur"] = -5
    ev[len(ev) // 3]["ts"] = "abc"
    kernel = next(e for e in ev[len(ev) // 4:] if e.get("cat") == "kernel")
    kernel["args"]["stream"] = 2 ** 70
    path = write(tmp_path / "t.json", doc)
    force_split(monkeypatch)
    one = kineto.read_trace(path, workers=1, block_bytes=4096)
    many = kineto.read_trace(path, workers=3, block_bytes=4096)
    assert one.skipped == 2
    assert columns(many) == columns(one)
    assert -1 in one.gpu["stream"].tolist()


def test_one_worker_never_forks(tmp_path, monkeypatch):
    """``--workers 1`` on one file reaches the reader: it reads the file in this process alone."""
    from whyidle.analysis.trace_job import read_ranks

    path = write(tmp_path / "t.json", mixed_trace())
    force_split(monkeypatch)
    monkeypatch.setattr(kineto, "_start_parallel", lambda *a: pytest.fail("split with workers=1"))
    assert kineto.read_trace(path, workers=1).events == len(mixed_trace()["traceEvents"])
    (summary,) = read_ranks([path], workers=1)
    assert summary.error is None and summary.metrics["steps"]["count"] == 40


@pytest.mark.slow
@needs_shared
def test_every_shared_trace_reads_the_same_split_in_processes(tmp_path, monkeypatch):
    """Each trace of ../shared/traces, uncompressed and split into 3 byte ranges, gives the columns
    and metrics of the single-process read; GPU idle share within 0.01 percentage points."""
    force_split(monkeypatch)
    files = sorted(glob.glob(os.path.join(SHARED_TRACES, "*", "*.json*")))
    assert files
    for i, src in enumerate(files):
        opener = gzip.open if src.endswith(".gz") else open
        with opener(src, "rb") as f:
            path = tmp_path / f"{i}.json"
            path.write_bytes(f.read())
        assert len(ranges(str(path), 3)) == 2, src
        one = kineto.read_trace(str(path), workers=1)
        many = kineto.read_trace(str(path), workers=3)
        assert columns(many) == columns(one), src
        m1, m3 = rank_metrics(one), rank_metrics(many)
        if m1["idle_share"] is not None:
            assert abs(m3["idle_share"] - m1["idle_share"]) * 100 <= 0.01, src
        assert m3 == m1, src
        os.remove(path)


def test_gpu_columns_keep_the_per_event_rules():
    """Device from args, else the pid; bytes only for copies and sets; Group size only for kernels;
    the memcpy direction and pageable flag from the name."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 3, "tid": 7, "ts": 1, "dur": 1,
         "args": {"stream": 7, "bytes": 5, "Group size": 8}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7, "ts": 2,
         "dur": 1, "args": {"device": 1, "stream": 7, "bytes": 64, "Group size": 8}},
        {"ph": "X", "cat": "Kernel", "name": "k2", "pid": "gpu", "tid": 7, "ts": 3, "dur": 1},
        {"ph": "X", "cat": "kernel", "name": "k3", "pid": 0, "tid": 7, "ts": 4, "dur": 1, "args": {"stream": "12"}},
        {"ph": "X", "cat": "hip_runtime", "name": "hipMemcpyWithStream", "pid": 0, "tid": 7, "ts": 5, "dur": 1,
         "args": {"stream": "0x0", "correlation": 117}},
    ]
    decoded = kineto._decode_array(msgspec.json.encode(events))
    assert all(type(e) is kineto_events._FastEvent for e in decoded)  # ROCm's string streams stay on the fast path
    cols = kineto_events._Columns()
    cols.add(decoded)
    raw = cols.raw()
    assert raw["gpu"]["device"].tolist() == [3, 1, 0, 0]
    assert raw["gpu"]["bytes"].tolist() == [-1, 64, -1, -1]
    assert raw["gpu"]["group"].tolist() == [8, -1, -1, -1]
    assert raw["gpu"]["copy"].tolist() == [-1, 1, -1, -1]
    assert raw["pageable"].tolist() == [False, True, False, False]
    assert np.array_equal(raw["gpu"]["stream"], [7, 7, -1, -1])  # a string stream is unknown, as before
    assert raw["runtime"]["correlation"].tolist() == [117]


def test_more_ranges_than_processes_give_the_single_process_columns(tmp_path, monkeypatch):
    """Ranges far smaller than the file: two processes take them in turn (each the next one left),
    and the merge in file order gives the columns of one process, strings in the same order."""
    path = write(tmp_path / "t.json", mixed_trace())
    force_split(monkeypatch)
    monkeypatch.setattr(kineto, "RANGE_BYTES", 2048)
    with open(path, "rb") as f:
        _head, _buf, a0 = kineto._find_array(f, 1 << 16, path)
    assert len(kineto._split_points(path, a0, 2, kineto.RANGE_BYTES)) > 8  # many ranges for 2 processes
    one = kineto.read_trace(path, workers=1, block_bytes=4096)
    many = kineto.read_trace(path, workers=2, block_bytes=4096)
    assert columns(many) == columns(one)


def test_a_helper_that_dies_has_its_ranges_read_by_the_parent(tmp_path, monkeypatch):
    """A forked helper that ends without sending its ranges (killed, out of memory): the ranges it
    took are read again by the parent; the columns are those of one process."""
    path = write(tmp_path / "t.json", mixed_trace())
    force_split(monkeypatch)
    monkeypatch.setattr(kineto, "RANGE_BYTES", 4096)

    def die(_fd, work):  # reads the ranges it takes, then dies before sending them
        try:
            work()
        finally:
            os._exit(1)

    monkeypatch.setattr(kineto, "_child", die)
    one = kineto.read_trace(path, workers=1, block_bytes=4096)
    many = kineto.read_trace(path, workers=3, block_bytes=4096)
    assert columns(many) == columns(one)


def test_a_file_cut_short_reads_the_same_split(tmp_path, monkeypatch):
    """A file cut short inside its last events, split: the range with the end keeps the events
    before the cut and says so, as the sequential read does."""
    text = json.dumps(mixed_trace()).encode()
    path = tmp_path / "t.json"
    path.write_bytes(text[: len(text) - 40])
    force_split(monkeypatch)
    one = kineto.read_trace(str(path), workers=1, block_bytes=4096)
    many = kineto.read_trace(str(path), workers=2, block_bytes=4096)
    assert one.cut and columns(many) == columns(one)


def test_an_error_in_a_helper_is_raised_by_the_parent(tmp_path, monkeypatch):
    """What a helper's reading raised reaches the caller as the reader's one-line error."""
    path = write(tmp_path / "t.json", mixed_trace())
    force_split(monkeypatch)
    parent = os.getpid()
    read_ranges = kineto._read_ranges

    def failing(*args, **kwargs):
        if os.getpid() != parent:
            raise msgspec.DecodeError("boom in a helper")
        return read_ranges(*args, **kwargs)

    monkeypatch.setattr(kineto, "_read_ranges", failing)
    with pytest.raises(kineto.TraceError, match="invalid JSON \\(boom in a helper\\)"):
        kineto.read_trace(path, workers=2, block_bytes=4096)


def test_columns_travel_between_processes_unchanged():
    """The pipe format of the helpers: arrays of every dtype, strings and nested lists round-trip."""
    payload = ("ok", [(3, {"gpu": {"ts": np.arange(5, dtype=np.float64), "kind": np.array([1, 2], np.int64)},
                           "pageable": np.array([True, False]), "strings": ["a", "é"], "tids": {"x": -1}},
                       b"tail")])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        kineto._child(w, lambda: payload[1])
    os.close(w)
    try:
        status, got = kineto._receive(r)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert status == "ok"
    (i, raw, tail), = got
    assert i == 3 and tail == b"tail" and raw["strings"] == ["a", "é"] and raw["tids"] == {"x": -1}
    assert raw["gpu"]["ts"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0] and raw["gpu"]["kind"].dtype == np.int64
    assert raw["pageable"].tolist() == [True, False]


def test_a_read_started_and_dropped_leaves_no_helper(tmp_path, monkeypatch):
    """A parallel read whose result is never asked for (the caller failed first): dropping it
    stops and reaps its helper processes."""
    path = write(tmp_path / "t.json", mixed_trace())
    force_split(monkeypatch)
    reading = kineto.TraceReading(path, workers=3, block_bytes=4096)
    pids = [pid for pid, _fd in reading._parallel.children]
    assert len(pids) == 2
    del reading
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
