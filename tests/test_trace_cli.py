"""`whyidle trace` end to end: synthetic traces written by the test, bad input, and the real traces
in ../shared/traces when that folder exists."""

from __future__ import annotations

import glob
import gzip
import json
import os

import pytest

from conftest import REPO, finding, invoke, run_whyidle
from whyidle.record.kineto import TraceError, read_trace

SHARED_TRACES = os.path.join(os.path.dirname(REPO), "shared", "traces")
needs_shared = pytest.mark.skipif(not os.path.isdir(SHARED_TRACES), reason="../shared/traces not present")


def synthetic_trace(steps=5, loader_us=6000, kernel_us=3000, single=True, rank=None, world=None,
                    pageable=False) -> dict:
    """ProfilerSteps of: a DataLoader wait, then one launch + kernel; the GPU idles during loading."""
    ev = []
    t = 1_000_000.0
    it = "_SingleProcessDataLoaderIter" if single else "_MultiProcessingDataLoaderIter"
    corr = 1
    for i in range(steps):
        step_us = loader_us + 100 + kernel_us + 50
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1, "ts": t,
                   "dur": step_us})
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"enumerate(DataLoader)#{it}.__next__", "pid": 1,
                   "tid": 1, "ts": t + 1, "dur": loader_us})
        launch = t + loader_us + 50
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch,
                   "dur": 10, "args": {"correlation": corr}})
        ev.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": launch + 20,
                   "dur": kernel_us, "args": {"device": 0, "stream": 7, "correlation": corr}})
        corr += 1
        if pageable:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1,
                       "ts": launch + 12, "dur": 5, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
                       "tid": 7, "ts": launch + 20 + kernel_us, "dur": 40,
                       "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 1 << 20}})
            corr += 1
        t += step_us
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8,
                                                     "computeMinor": 0, "totalGlobalMem": 85_000_000_000}],
           "traceEvents": ev, "traceName": "synthetic"}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": world, "backend": "nccl"}
    return doc


def write(path, doc, gz=False) -> str:
    data = json.dumps(doc, indent=1).encode()
    path = str(path)
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return path


def trace_json(path, *extra):
    proc = invoke(["trace", str(path), "--json", "-", *extra])
    return proc, (json.loads(proc.stdout) if proc.returncode == 0 else None)


def test_input_bound_synthetic_trace(tmp_path):
    path = write(tmp_path / "t.pt.trace.json.gz", synthetic_trace(), gz=True)
    proc, rep = trace_json(path)
    assert proc.returncode == 0, proc.stderr
    assert rep["schema"] == "whyidle.report/1" and rep["source"] == "trace"
    assert rep["verdict"] == "input_bound"
    f = finding(rep, "input_bound")
    assert f["evidence"]["cause"] == "loader_in_main_process"
    assert rep["device"]["name"] == "NVIDIA A100-SXM4-80GB" and rep["device"]["compute_capability"] == "8.0"
    gpu = rep["metrics"]["gpu"]
    assert gpu["busy_share"] + gpu["idle_share"] == pytest.approx(1.0, abs=1e-3)
    assert rep["metrics"]["steps"] == 5


def test_pageable_and_ranks(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    write(job / "rank-0.json", synthetic_trace(rank=0, world=2, pageable=True, loader_us=100))
    write(job / "rank-1.json", synthetic_trace(rank=1, world=2, pageable=True, loader_us=100, kernel_us=6000))
    proc, rep = trace_json(job)
    assert proc.returncode == 0, proc.stderr
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert finding(rep, "pageable_transfers") is not None
    imb = finding(rep, "imbalance")
    assert imb is not None and imb["evidence"]["straggler_rank"] == 1
    proc, rep1 = trace_json(job, "--rank", "1")
    assert proc.returncode == 0 and "ranks" not in rep1
    proc = invoke(["trace", str(job), "--rank", "5"])
    assert proc.returncode == 2 and "no trace of rank 5" in proc.stderr and "Traceback" not in proc.stderr


def test_a_folder_written_by_two_runs_is_not_two_ranks(tmp_path):
    """A tensorboard_trace_handler folder a script wrote to twice holds two traces without
    distinct ranks: the report is the newest run's, with a note, not a two-rank job."""
    folder = tmp_path / "tb"
    folder.mkdir()
    write(folder / "host_1.111.pt.trace.json", synthetic_trace(loader_us=9000))
    write(folder / "host_2.222.pt.trace.json", synthetic_trace(loader_us=100))
    os.utime(folder / "host_1.111.pt.trace.json", (1_700_000_000, 1_700_000_000))
    proc, rep = trace_json(folder)
    assert proc.returncode == 0, proc.stderr
    assert "ranks" not in rep
    assert rep["notes"][0].startswith("2 trace files of separate runs here") and "host_2.222" in rep["notes"][0]
    assert not any("ranks; the metrics are" in n for n in rep["notes"])


@pytest.mark.parametrize("kind", ["invalid_json", "not_a_trace", "empty_folder", "missing", "cut_in_the_head",
                                  "empty_file", "deep_nesting", "gzip_of_nothing"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, kind):
    path = tmp_path / "bad.json"
    if kind == "invalid_json":
        path.write_text('{"traceEvents": [ {"ph": "X", "ts": 1,, } ]}')
    elif kind == "not_a_trace":
        path.write_text('{"hello": "world", "values": [1, 2, 3]}')
    elif kind == "empty_folder":
        path = tmp_path / "empty"
        path.mkdir()
    elif kind == "missing":
        path = tmp_path / "nope.json"
    elif kind == "cut_in_the_head":  # not one event before the cut
        text = json.dumps(synthetic_trace(steps=20))
        path.write_text(text[: text.index('"traceEvents"') + 40])
    elif kind == "empty_file":
        path.write_text("")
    elif kind == "deep_nesting":
        path.write_text("[" * 100_000)
    elif kind == "gzip_of_nothing":
        path = tmp_path / "bad.json.gz"
        path.write_bytes(gzip.compress(b"")[:10])
    proc = (run_whyidle if kind == "invalid_json" else invoke)(["trace", str(path)])  # one as a real process
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("whyidle: "), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("gz", [False, True])
def test_a_trace_cut_short_is_reported_up_to_the_cut_with_a_note(tmp_path, gz):
    """A trace written by a job killed mid-write (or a download cut short) keeps the events
    before the cut: the report covers them and says where the events end."""
    full = json.dumps(synthetic_trace(steps=40)).encode()
    data = gzip.compress(full)[: len(gzip.compress(full)) * 2 // 3] if gz else full[: len(full) // 2]
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(data)
    proc, rep = trace_json(path)
    assert proc.returncode == 0, proc.stderr
    assert any("the events end early" in n and ("gzip" in n) == gz for n in rep["notes"]), rep["notes"]
    assert 5 <= rep["metrics"]["steps"] < 40 and rep["verdict"] == "input_bound"


def test_damaged_events_are_left_out_and_the_rest_is_reported(tmp_path):
    """Events with a string ts, a negative or NaN duration, a list for a category, junk bytes and
    invalid UTF-8 in the middle of the array: left out and counted, the other steps reported."""
    doc = synthetic_trace(steps=30)
    ev = doc["traceEvents"]
    ev[5]["ts"] = "abc"
    ev[9]["dur"] = -5
    ev[13]["cat"] = ["kernel"]
    ev[17]["tid"] = {"a": 1}
    ev[21]["args"] = [1, 2]
    ev.insert(30, 42)
    text = json.dumps(doc).replace('"ts": ' + str(ev[40]["ts"]), '"ts": NaN', 1).encode()
    cut = text.index(b'{"ph"', len(text) // 2)
    text = text[:cut] + b'{"ph": "X", "name": "\xff\xfe junk' + b"\x00\x17}}}, " + text[cut:]
    proc, rep = trace_json(write_bytes(tmp_path / "damaged.json", text))
    assert proc.returncode == 0, proc.stderr
    note = next(n for n in rep["notes"] if "left out" in n)
    assert "left out 6 events or damaged pieces" in note, note
    assert not any("end early" in n for n in rep["notes"])  # damaged, not cut short
    assert rep["metrics"]["steps"] >= 25 and rep["verdict"] == "input_bound"


def write_bytes(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_empty_trace_events_and_cpu_only_give_a_report(tmp_path):
    doc = synthetic_trace()
    doc["traceEvents"] = []
    proc, rep = trace_json(write(tmp_path / "empty.json", doc))
    assert proc.returncode == 0, proc.stderr
    assert rep["verdict"] == "unknown" and rep["metrics"]["gpu"] is None
    cpu = synthetic_trace()
    cpu["traceEvents"] = [e for e in cpu["traceEvents"] if e["cat"] not in ("kernel", "cuda_runtime")]
    proc, rep = trace_json(write(tmp_path / "cpu.json", cpu))
    assert proc.returncode == 0, proc.stderr
    # CPU-only: the cores are the device; its steps still wait in the DataLoader
    assert rep["verdict"] == "input_bound" and rep["metrics"]["gpu"] is None
    assert "while the training waits" in rep["findings"][0]["summary"]
    assert "pin_memory" not in rep["findings"][0]["fix"]["code"]
    assert [f["id"] for f in rep["findings"]] == ["input_bound", "no_steps"]
    assert any("No GPU activity" in n for n in rep["notes"])


def test_reader_cuts_blocks_anywhere(tmp_path):
    # events whose strings hold "}, {" must not be cut there; any block size gives the same columns
    doc = synthetic_trace(steps=30)
    for e in doc["traceEvents"]:
        if e["cat"] == "kernel":
            e["name"] = 'void f<{lambda}, {x}>(), {"tricky": 1}'
    path = write(tmp_path / "t.json", doc)
    ref = read_trace(path)
    for block in (64, 257, 4096):
        t = read_trace(path, block_bytes=block)
        assert t.events == ref.events == len(doc["traceEvents"])
        assert t.gpu["ts"].tolist() == ref.gpu["ts"].tolist()
        assert t.strings[t.gpu["name"][0]] == 'void f<{lambda}, {x}>(), {"tricky": 1}'
    assert ref.device_properties[0]["computeMajor"] == 8


def test_an_event_with_infinity_or_nan_is_skipped_and_the_rest_read(tmp_path):
    """Python's JSON writer puts NaN and Infinity in a file (not standard JSON): the event holding
    one is counted as skipped and the events after it are read, at any block size (the fuzz case
    that read the rest of the file as cut short)."""
    doc = synthetic_trace(steps=10)
    n = len(doc["traceEvents"])
    doc["traceEvents"].insert(n // 2, {"ph": "X", "cat": "kernel", "name": "k", "ts": float("inf"), "dur": None})
    doc["traceEvents"].insert(n // 3, {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": float("nan")})
    path = write(tmp_path / "t.json", doc)
    for block in (64, 257, 1 << 20):
        t = read_trace(path, block_bytes=block)
        assert (t.events, t.skipped, t.cut) == (n + 2, 2, None), block


def test_a_negative_numeric_thread_id_is_kept_as_it_is(tmp_path):
    """A thread id that is a negative number (the fuzz case: -717870110) is that thread's id, not
    a named thread's index: read without a table as long as its value (5 GB there)."""
    doc = {"traceEvents": [{"ph": "X", "cat": "cuda_runtime", "name": "", "ts": 0, "dur": 1, "pid": 0,
                            "tid": -717870110},
                           {"ph": "X", "cat": "cuda_runtime", "name": "", "ts": 2, "dur": 1, "pid": 0,
                            "tid": "stream 7"}]}
    t = read_trace(write(tmp_path / "t.json", doc))
    assert t.events == 2 and sorted(t.runtime["tid"].tolist())[0] == -717870110


@pytest.mark.slow
@needs_shared
def test_every_shared_trace_gives_a_report():
    for folder in sorted(glob.glob(os.path.join(SHARED_TRACES, "*"))):
        if not os.path.isdir(folder):
            continue
        proc, rep = trace_json(folder)
        assert proc.returncode == 0, (folder, proc.stderr[-2000:])
        assert rep["source"] == "trace" and rep["verdict"], folder


@needs_shared
def test_resnet_dataloader_pair():
    _, nw0 = trace_json(os.path.join(SHARED_TRACES, "kineto_resnet50_v100_num_workers_0"))
    _, nw4 = trace_json(os.path.join(SHARED_TRACES, "kineto_resnet50_v100_num_workers_4"))
    f0 = finding(nw0, "input_bound")
    assert nw0["verdict"] == "input_bound" and f0["evidence"]["cause"] == "loader_in_main_process"
    share0 = nw0["metrics"]["shares"]["dataloader"]
    share4 = nw4["metrics"]["shares"]["dataloader"]
    assert share4 < share0 / 3, (share0, share4)
    assert nw4["verdict"] != "input_bound" or finding(nw4, "input_bound")["evidence"]["data_wait_share"] < share0 / 3


def test_reader_error_type(tmp_path):
    with pytest.raises(TraceError):
        read_trace(str(tmp_path / "missing.json"))


def test_parallel_read_equals_sequential(tmp_path, monkeypatch):
    from whyidle.record import kineto

    doc = synthetic_trace(steps=200, pageable=True)
    for i, e in enumerate(doc["traceEvents"]):
        if e["cat"] == "kernel":
            e["name"] = f'void f<{{lambda}}, {{x}}>() #{i % 7}'  # "}, {" inside names near split points
    path = write(tmp_path / "big.json", doc)
    seq = read_trace(path)
    monkeypatch.setattr(kineto, "PARALLEL_MIN_BYTES", 1)
    for workers in (2, 3):
        par = read_trace(path, workers=workers)
        assert par.events == seq.events
        for group in ("gpu", "runtime", "cpu"):
            for key, col in getattr(seq, group).items():
                other = getattr(par, group)[key]
                if key in ("name", "cat"):
                    assert [seq.strings[i] for i in col] == [par.strings[i] for i in other], (group, key)
                else:
                    assert col.tolist() == other.tolist(), (group, key)
        assert par.steps == seq.steps and par.pageable.tolist() == seq.pageable.tolist()
        assert par.device_properties == seq.device_properties
