"""Hostile and damaged input for the readers: ``whyidle report``, ``trace`` and ``compare`` give a
report of what is usable (saying what was left out) or one line and exit 2, never a traceback.

A mutation fuzzer (``tests/fuzzing.py``) over the recorded runs of ``tests/data/runs``, a synthetic
trace and the real traces of ``../shared/traces`` (when present), with fixed seeds, and property
tests (hypothesis) for the schema of run records: any record the reader keeps must be analyzable.
``benchmarks/fuzz.py`` runs the same fuzzer longer.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil

import fuzzing
import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from whyidle.record import kineto, schema
from whyidle.record.reader import RunDirError, load_run, read_jsonl

RUNS = sorted(os.path.join(REPO, "tests", "data", "runs", d) for d in os.listdir(os.path.join(REPO, "tests", "data", "runs")))

#: Cases per fuzz test in CI: ~10 s each on the 2-core test machine.
CASES = {"run": 250, "compare": 30, "trace": 150}
#: Examples of the schema property test (``benchmarks/fuzz.py --examples`` runs more).
EXAMPLES = int(os.environ.get("WHYIDLE_FUZZ_EXAMPLES", "40"))

pytestmark = pytest.mark.slow  # long loops: left out of the fast tier


def _fuzz(kind: str, seed: int, tmp_path) -> None:
    rng = random.Random(seed)
    seeds = fuzzing.seed_traces(2 << 20) if kind == "trace" else None
    failures = []
    for i in range(CASES[kind]):
        if kind == "run":
            o = fuzzing.fuzz_run_dir(rng.choice(RUNS), str(tmp_path), rng)
        elif kind == "compare":
            o = fuzzing.fuzz_compare(RUNS, str(tmp_path), rng)
        else:
            name, text = rng.choice(seeds)
            o = fuzzing.fuzz_trace(text, name, str(tmp_path), rng)
        if o.problem:
            failures.append(f"case {i}: {o.what}\n  {o.problem}")
    assert not failures, f"{len(failures)} of {CASES[kind]} cases broke the contract:\n" + "\n".join(failures[:5])


@pytest.mark.parametrize("kind", ["run", "compare", "trace"])
def test_fuzzed_inputs_never_give_a_traceback(kind, tmp_path):
    _fuzz(kind, 20261203, tmp_path)


# -- property tests: the schema is enough for the analysis ----------------------------------------

def _values(spec):
    """A hypothesis strategy of values that pass ``spec`` (:mod:`whyidle.record.schema`), edge
    cases included: 0, negative, huge (int64 bounds), empty lists, tiny fractions."""
    if spec == schema.NUM:
        return st.one_of(st.integers(-(2 ** 63) + 1, 2 ** 63 - 1),
                         st.floats(-9e18, 9e18, allow_nan=False, allow_infinity=False), st.sampled_from([0, 1, -1, 0.5]))
    if spec == schema.INT:
        return st.one_of(st.integers(-(2 ** 63) + 1, 2 ** 63 - 1), st.sampled_from([0, 1, -1, 7]))
    if spec == schema.TEXT:
        return st.one_of(st.text(max_size=20), st.sampled_from(["data", "other", "forward", "a.py:1 f", "checkpoint"]))
    if spec == schema.BOOL:
        return st.booleans()
    if spec == schema.OBJ:
        return st.dictionaries(st.text(max_size=5), st.one_of(st.none(), st.integers(-5, 5)), max_size=2)
    if spec == schema.ANY:
        return st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=5), st.just({}))
    if isinstance(spec, dict):
        fields = {}
        optional = {}
        for key, sub in spec.items():
            (optional if key.endswith("?") else fields)[key.rstrip("?")] = _values(sub)
        return st.fixed_dictionaries(fields, optional=optional)
    tag = spec[0]
    if tag == "opt":
        return st.one_of(st.none(), _values(spec[1]))
    if tag == "list":
        return st.lists(_values(spec[1]), max_size=4)
    if tag == "map":
        return st.dictionaries(st.sampled_from(["user", "idle", "cpu", "float32", "a"]), _values(spec[1]), max_size=3)
    specs, min_len, exact = spec[1], spec[2], spec[3]
    n = st.just(len(specs)) if exact else st.integers(min_len, len(specs))
    return n.flatmap(lambda k: st.tuples(*[_values(s) for s in specs[:k]]).map(list))


def _record(kind: str):
    return _values(schema.SCHEMAS[kind]).map(lambda r: {**r, "k": kind}).flatmap(
        lambda r: st.fixed_dictionaries({"t": _values(schema.NUM)}).map(lambda t: {**r, **t}))


PROC_KINDS = [k for k in schema.SCHEMAS if not k.startswith(("host", "gpu")) and k != "gpm"]
HOST_KINDS = ["host_static", "host", "host_proc", "host_top"]
GPU_KINDS = ["gpu_static", "gpu_util", "gpu_state", "gpu_limits", "gpu_counters", "gpm", "gpu_notice"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(proc=st.lists(st.sampled_from(PROC_KINDS).flatmap(_record), max_size=6),
       host=st.lists(st.sampled_from(HOST_KINDS).flatmap(_record), max_size=4),
       gpu=st.lists(st.sampled_from(GPU_KINDS).flatmap(_record), max_size=4),
       base=st.sampled_from(RUNS))
def test_any_record_the_reader_keeps_can_be_reported(tmp_path_factory, proc, host, gpu, base):
    """Records built from the schema (any values it lets through: huge, negative, zero-length)
    added to a real run: the report is written, or one line names the problem."""
    target = str(tmp_path_factory.mktemp("run") / "r")
    shutil.copytree(base, target)
    for name, recs in (("host.jsonl", host), ("gpu.jsonl", gpu),
                       (next(f for f in os.listdir(target) if f.startswith("proc-")), proc)):
        with open(os.path.join(target, name), "a", encoding="utf-8") as f:
            for r in recs:
                kept = schema.problem(r) is None
                f.write(json.dumps(r) + "\n")
                assert kept or r.get("t0", 0) > r.get("t1", 0), schema.problem(r)  # the generator makes valid ones
    out = os.path.join(target, "out.json")
    result = fuzzing.run_cli(["report", target, "--json", out])
    assert fuzzing._check(result, target, out if result.exit_code == 0 else None) is None


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.one_of(st.binary(max_size=40), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8).map(lambda v: json.dumps(v).encode())), max_size=8))
def test_read_jsonl_of_any_bytes_reads_or_says_the_file_is_corrupt(tmp_path_factory, lines):
    path = str(tmp_path_factory.mktemp("j") / "proc-1.jsonl")
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    try:
        records, problems = read_jsonl(path)
    except RunDirError as exc:
        assert "\n" not in str(exc) and path in str(exc)
        return
    assert all(isinstance(r, dict) and schema.problem(r) is None for r in records)
    assert all("\n" not in p for p in problems)


@settings(max_examples=150, deadline=None)
@given(events=st.lists(st.one_of(
    st.fixed_dictionaries({"ph": st.just("X"), "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy"]),
                           "name": st.text(max_size=10), "ts": st.one_of(st.integers(), st.floats(), st.text(max_size=3)),
                           "dur": st.one_of(st.integers(), st.floats(), st.none())},
                          optional={"args": st.dictionaries(st.sampled_from(["device", "stream", "correlation", "bytes"]),
                                                            st.one_of(st.integers(), st.text(max_size=3)), max_size=3),
                                    "tid": st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)),
                                    "pid": st.one_of(st.integers(), st.none())}),
    st.integers(), st.text(max_size=4)), max_size=12), gz=st.booleans())
def test_read_trace_of_any_events_reads_them_or_raises_trace_error(tmp_path_factory, events, gz):
    """Events of any shape and value: the reader keeps the usable ones (counting the others) or
    raises TraceError; never another exception."""
    data = json.dumps({"traceEvents": events}).encode()
    path = str(tmp_path_factory.mktemp("t") / ("t.json.gz" if gz else "t.json"))
    with open(path, "wb") as f:
        f.write(gzip.compress(data) if gz else data)
    try:
        t = kineto.read_trace(path)
    except kineto.TraceError as exc:
        assert "\n" not in str(exc)
        return
    assert t.events == len(events)
    assert all(abs(v) < 1e17 for v in list(t.gpu["ts"]) + list(t.cpu["ts"]))
    assert all(0 <= v < 1e13 for v in list(t.gpu["dur"]) + list(t.cpu["dur"]))


def test_a_gzip_bomb_is_refused_in_one_line(tmp_path, monkeypatch):
    """A gzip file that decompresses to over MAX_GZIP_RATIO times its size is refused (the limit is
    lowered here: a real bomb is gigabytes)."""
    monkeypatch.setattr(kineto, "GZIP_FREE_BYTES", 1 << 20)
    text = json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}] * 200_000})
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(text.encode() + b" " * (64 << 20), compresslevel=9))
    assert os.path.getsize(path) * kineto.MAX_GZIP_RATIO < 64 << 20
    result = fuzzing.run_cli(["trace", str(path)])
    assert result.exit_code == 2 and "decompresses to over 200x its size" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_run_file_growing_while_it_is_read_is_reported(tmp_path):
    """A run directory read while its writer still appends (``whyidle report`` of a live run):
    the half-written last line is skipped, the report is written."""
    import threading

    target = str(tmp_path / "run")
    shutil.copytree(RUNS[0], target)
    proc = os.path.join(target, next(f for f in os.listdir(target) if f.startswith("proc-")))
    with open(proc, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    stop = threading.Event()

    def append():
        with open(proc, "ab") as f:
            while not stop.is_set():
                for line in lines[:40]:
                    f.write(line[: len(line) // 2])
                    f.flush()
                    f.write(line[len(line) // 2:])
                    f.flush()

    writer = threading.Thread(target=append)
    writer.start()
    try:
        for _ in range(3):
            result = fuzzing.run_cli(["report", target, "--json", str(tmp_path / "o.json")])
            assert fuzzing._check(result, target, str(tmp_path / "o.json") if result.exit_code == 0 else None) is None
            assert result.exit_code == 0, result.stderr
    finally:
        stop.set()
        writer.join()
    assert load_run(target).steps


def test_a_trace_truncated_while_it_is_read_keeps_what_was_read(tmp_path, monkeypatch):
    """A trace file cut shorter while the reader is in it (overwritten by a new profiler run):
    the events read before are kept, and where they end is said (``cut``, a note in the report)."""
    from test_trace_cli import synthetic_trace

    doc = synthetic_trace(steps=400)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    real_open = kineto._open

    class Shrinking:
        """The file as the reader sees it while a writer truncates it after the first read."""

        def __init__(self, p):
            self.f = real_open(p)
            self.p = p

        def read(self, size):
            block = self.f.read(size)
            os.truncate(self.p, min(os.path.getsize(self.p), 3 * len(block)))
            return block

        def close(self):
            self.f.close()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    monkeypatch.setattr(kineto, "_open", Shrinking)
    t = kineto.read_trace(str(path), block_bytes=16 * 1024)
    assert t.cut and "cut short" in t.cut
    assert 0 < len(t.steps) < 400


def test_a_trainer_file_cut_short_is_not_told_as_teardown(tmp_path):
    """A proc file that ends early (a full disk, a kill, a cut copy): the report says the records
    end before the command did, instead of calling the unrecorded training "a final evaluation or
    save"."""
    target = str(tmp_path / "run")
    shutil.copytree(os.path.join(REPO, "tests", "data", "runs", "python_loop_loss"), target)
    proc = os.path.join(target, next(f for f in os.listdir(target) if f.startswith("proc-")))
    with open(proc, "rb") as f:
        data = f.read()
    with open(proc, "wb") as f:
        f.write(data[: len(data) // 2])
    times = [json.loads(line)["t"] for line in data.splitlines()]
    with open(os.path.join(target, "meta.json")) as f:
        meta = json.load(f)
    meta.update(start_t=min(times) - 10 ** 8, exit_t=max(times))  # a current run's: the command's own times
    with open(os.path.join(target, "meta.json"), "w") as f:
        json.dump(meta, f)
    result = fuzzing.run_cli(["report", target, "--json", "-"])
    assert result.exit_code == 0, result.stderr
    notes = json.loads(result.stdout)["notes"]
    assert any(n.startswith("The trainer's records end ") and "before the command did" in n for n in notes), notes
    assert not any("a final evaluation or save" in n for n in notes)
