"""The run directory's writers and readers (whyidle.record), on temporary files only."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from whyidle.record.reader import RunData, RunDirError, load_run, read_jsonl
from whyidle.record.steptable import StepTable, expand_lite
from whyidle.record.writer import MAX_BUFFERED_RECORDS, JsonlWriter, write_json_atomic

META = {"format": "whyidle.run/1", "tool_version": "0.1.0", "name": "t", "command": ["python", "train.py"]}


def write_lines(path, lines: list[str], end: str = "\n") -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + end)


# -- JsonlWriter ---------------------------------------------------------------------------------

def test_writer_round_trip_keeps_order_and_values(tmp_path):
    path = str(tmp_path / "proc-1.jsonl")
    w = JsonlWriter(path)
    records = [{"k": "step", "t": 10, "i": 0, "t0": 1, "t1": 10, "samples": None},
               {"k": "notice", "t": 11, "msg": "é ünïcode ✓"},
               {"k": "stacks", "t": 12, "sites": [["data", "a.py:1 f", None, 3]]}]
    for r in records:
        w.add(r)
    assert not os.path.exists(path)  # created on first flush, not before
    assert w.flush() == 3
    assert w.flush() == 0  # nothing queued
    w.add({"k": "exit", "t": 13})
    w.close()
    got, problems = read_jsonl(path)
    assert got == records + [{"k": "exit", "t": 13}]
    assert problems == []
    # one compact JSON object per line
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    assert lines[-1] == "" and len(lines) == 5
    assert lines[0] == '{"k":"step","t":10,"i":0,"t0":1,"t1":10,"samples":null}'


def test_writer_appends_to_existing_file(tmp_path):
    path = str(tmp_path / "host.jsonl")
    write_lines(path, ['{"k":"host","t":1,"cpu":{},"procs":[]}'])
    w = JsonlWriter(path)
    w.add({"k": "host", "t": 2, "cpu": {}, "procs": []})
    w.close()
    got, _ = read_jsonl(path)
    assert [r["t"] for r in got] == [1, 2]


def test_writer_non_serializable_values_become_strings(tmp_path):
    path = str(tmp_path / "p.jsonl")
    w = JsonlWriter(path)

    class Thing:
        def __str__(self):
            return "thing!"

    w.add({"k": "x", "t": 1, "v": Thing()})
    w.close()
    got, _ = read_jsonl(path)
    assert got == [{"k": "x", "t": 1, "v": "thing!"}]


def test_writer_buffer_cap_counts_dropped(tmp_path):
    path = str(tmp_path / "p.jsonl")
    w = JsonlWriter(path, max_buffered=3)
    for i in range(5):
        w.add({"k": "x", "t": i})
    assert w.dropped == 2
    assert w.flush() == 3
    # after a flush the buffer has room again; the drop count is cumulative
    for i in range(5, 9):
        w.add({"k": "x", "t": i})
    assert w.dropped == 3
    w.close()
    got, _ = read_jsonl(path)
    assert [r["t"] for r in got] == [0, 1, 2, 5, 6, 7]


def test_writer_default_cap():
    assert JsonlWriter("/nonexistent/x.jsonl").max_buffered == MAX_BUFFERED_RECORDS == 100_000


def test_writer_close_twice_is_safe(tmp_path):
    path = str(tmp_path / "p.jsonl")
    w = JsonlWriter(path)
    w.add({"k": "x", "t": 1})
    w.close()
    w.close()
    assert read_jsonl(path)[0] == [{"k": "x", "t": 1}]


def test_writer_abandon_forgets_queue_and_file(tmp_path):
    path = str(tmp_path / "p.jsonl")
    w = JsonlWriter(path)
    w.add({"k": "x", "t": 1})
    w.flush()
    w.add({"k": "x", "t": 2})
    w.add({"k": "x", "t": 3})
    w.abandon()
    assert w.flush() == 0  # the queued records are gone, nothing written
    assert w._file is None
    assert read_jsonl(path)[0] == [{"k": "x", "t": 1}]
    # the writer is usable again afterwards (a forked child continues with its own handle)
    w.add({"k": "x", "t": 4})
    w.close()
    assert [r["t"] for r in read_jsonl(path)[0]] == [1, 4]


def test_writer_flush_raises_oserror_for_unwritable_path(tmp_path):
    w = JsonlWriter(str(tmp_path / "missing-dir" / "p.jsonl"))
    w.add({"k": "x", "t": 1})
    with pytest.raises(OSError):
        w.flush()


# -- write_json_atomic ---------------------------------------------------------------------------

def test_write_json_atomic_replaces_and_leaves_no_temp(tmp_path):
    path = str(tmp_path / "meta.json")
    write_json_atomic(path, {"format": "whyidle.run/1", "exit_code": None})
    write_json_atomic(path, {"format": "whyidle.run/1", "exit_code": 0, "ended_utc": "2026-01-01T00:00:00Z"})
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == {"format": "whyidle.run/1", "exit_code": 0, "ended_utc": "2026-01-01T00:00:00Z"}
    assert sorted(os.listdir(tmp_path)) == ["meta.json"]


def test_write_json_atomic_unwritable_dir_raises(tmp_path):
    with pytest.raises(OSError):
        write_json_atomic(str(tmp_path / "nope" / "meta.json"), {"a": 1})


# -- read_jsonl ----------------------------------------------------------------------------------

def test_read_missing_file_is_empty(tmp_path):
    assert read_jsonl(str(tmp_path / "gpu.jsonl")) == ([], [])


def test_read_empty_file_and_blank_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("")
    assert read_jsonl(str(path)) == ([], [])
    path.write_text('{"k":"a","t":1}\n\n   \n{"k":"b","t":2}\n\n\n')
    records, problems = read_jsonl(str(path))
    assert [r["k"] for r in records] == ["a", "b"]
    assert problems == []


def test_read_last_line_without_newline_is_fine(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"k":"a","t":1}\n{"k":"b","t":2}')
    assert [r["k"] for r in read_jsonl(str(path))[0]] == ["a", "b"]
    assert read_jsonl(str(path))[1] == []


@pytest.mark.parametrize("tail", ['{"k":"step","t":5,"i"', '{"k":"ste', "12", '["not", "an", "object"]'])
def test_truncated_last_line_is_skipped_with_a_note(tmp_path, tail):
    path = tmp_path / "proc-7.jsonl"
    path.write_text('{"k":"proc","t":1}\n{"k":"step","t":2}\n' + tail)
    records, problems = read_jsonl(str(path))
    assert [r["k"] for r in records] == ["proc", "step"]
    assert len(problems) == 1
    assert "proc-7.jsonl" in problems[0] and "truncated last line" in problems[0]


def test_truncated_last_line_followed_by_blank_lines_is_still_last(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"k":"a","t":1}\n{"k":"b"\n\n')
    records, problems = read_jsonl(str(path))
    assert records == [{"k": "a", "t": 1}]
    assert len(problems) == 1


def test_truncated_multibyte_utf8_last_line_is_skipped(tmp_path):
    path = tmp_path / "a.jsonl"
    good = '{"k":"a","t":1}\n'.encode()
    cut = '{"k":"notice","msg":"✓'.encode()[:-1]  # a kill in the middle of a UTF-8 sequence
    path.write_bytes(good + cut)
    records, problems = read_jsonl(str(path))
    assert records == [{"k": "a", "t": 1}]
    assert len(problems) == 1


@pytest.mark.parametrize("bad", ['{"k":"b"', "garbage", "[1, 2]", '"a string"', "[" * 100_000])
def test_damaged_middle_line_is_skipped_with_a_note_naming_file_and_line(tmp_path, bad):
    path = tmp_path / "host.jsonl"
    write_lines(path, ['{"k":"a","t":1}', "", bad, '{"k":"c","t":3}'])
    records, problems = read_jsonl(str(path))
    assert records == [{"k": "a", "t": 1}, {"k": "c", "t": 3}]
    assert problems == ["host.jsonl: skipped 1 damaged line (line 3: not a JSON record)"]  # 1-based, blanks counted


def test_a_file_of_mostly_damaged_lines_is_refused_in_one_line(tmp_path):
    path = tmp_path / "proc-1.jsonl"
    write_lines(path, ['{"k":"a","t":1}', "garbage", "\x00\x01", "more garbage"])
    with pytest.raises(RunDirError) as err:
        read_jsonl(str(path))
    msg = str(err.value)
    assert str(path) in msg and "line 2" in msg and "\n" not in msg


def test_records_with_unusable_values_are_left_out_and_counted(tmp_path):
    path = tmp_path / "proc-1.jsonl"
    good = {"k": "region", "t": 5, "kind": "checkpoint", "t0": 1, "t1": 4}
    write_lines(path, [json.dumps(r) for r in (
        good,
        {**good, "t0": "1"},  # text for a number
        {**good, "t1": 0},  # ends before it starts
        {**good, "t0": float("nan")},  # written by Python's json: NaN
        {"k": 7, "t": 1},  # no kind
        {"k": "stacks", "t": 2, "sites": [["data", {"a": 1}, None, 3, 1.0]]},  # an object for a site
        {"k": "step", "t": 9, "i": 0, "t0": 1, "t1": "x"},
    )])
    table = StepTable()
    records, problems = read_jsonl(str(path), steps=table)
    assert records == [good] and len(table) == 0
    assert "left out 3 'region' records with unusable values (t0: text, expected a number)" in problems[0]
    assert any("'stacks' record with unusable values (sites[0][1]: an object, expected text)" in p for p in problems)
    assert any("1 'step' record" in p for p in problems) and any("(no record kind (k))" in p for p in problems)


# -- load_run ------------------------------------------------------------------------------------

def make_run_dir(tmp_path, meta=META):
    d = tmp_path / "run"
    d.mkdir()
    if meta is not None:
        write_json_atomic(str(d / "meta.json"), meta)
    return d


def test_load_run_reads_every_file(tmp_path):
    d = make_run_dir(tmp_path)
    write_lines(d / "host.jsonl", ['{"k":"host_static","t":0,"cpu_count":4}', '{"k":"host","t":1,"cpu":{},"procs":[]}'])
    write_lines(d / "gpu.jsonl", ['{"k":"gpu_notice","t":0,"msg":"no NVML"}'])
    write_lines(d / "proc-123.jsonl", ['{"k":"proc","t":1,"pid":123}', '{"k":"step","t":2,"i":0,"t0":1,"t1":2}'])
    write_lines(d / "proc-45.jsonl", ['{"k":"proc","t":1,"pid":45}'])
    write_lines(d / "proc-abc.jsonl", ['{"k":"proc","t":1}'])  # not a pid: ignored
    (d / "report.json").write_text("{}")
    run = load_run(str(d))
    assert isinstance(run, RunData)
    assert run.path == str(d)
    assert run.meta == META
    assert [r["k"] for r in run.host] == ["host_static", "host"]
    assert run.gpu == [{"k": "gpu_notice", "t": 0, "msg": "no NVML"}]
    assert set(run.procs) == {123, 45}
    assert all(isinstance(pid, int) for pid in run.procs)
    # step records go into a columnar table per process, the rest stays a record list
    assert [r["k"] for r in run.procs[123]] == ["proc"]
    assert set(run.steps) == {123, 45}
    assert len(run.steps[123]) == 1 and len(run.steps[45]) == 0
    assert run.problems == []


def test_load_run_step_table_reads_like_records(tmp_path):
    d = make_run_dir(tmp_path)
    steps = [{"k": "step", "t": 20, "i": 0, "t0": 10, "t1": 20, "by": "loader", "data": 5, "fwd": 1, "bwd": 1,
              "opt": 0, "eval": 0, "batches": 1, "samples": None, "cpu": 7, "data_cpu": 3, "boundary": True},
             {"k": "step", "t": 30, "i": 1, "t0": 20, "t1": 30, "by": "optimizer", "data": 2, "fwd": 3, "bwd": 3,
              "opt": 1, "eval": 0, "batches": 2, "samples": 64, "cpu": 9, "data_cpu": 1, "boundary": False}]
    lines = [json.dumps({"k": "proc", "t": 1, "pid": 9})] + [json.dumps(s) for s in steps]
    lines.append(json.dumps({"k": "gpu_step", "t": 40, "i": 1, "gpu_ms": 2.5}))
    lines.append(json.dumps({"k": "gpu_step", "t": 41, "i": 7, "gpu_ms": 1.0}))  # unknown step: ignored
    write_lines(d / "proc-9.jsonl", lines)
    run = load_run(str(d))
    assert run.procs[9] == [{"k": "proc", "t": 1, "pid": 9}]
    rows = run.steps[9].rows()
    assert len(rows) == 2
    for row, rec in zip(rows, steps):
        for key in ("i", "t0", "t1", "by", "data", "fwd", "bwd", "opt", "eval", "batches", "samples", "cpu",
                    "data_cpu", "boundary", "k"):
            assert row[key] == rec[key], key
    assert rows[0]["gpu_ms"] is None and rows[1]["gpu_ms"] == 2.5
    assert rows[0].get("samples") is None and rows[1].get("samples") == 64


def test_load_run_collects_truncation_problems_from_all_files(tmp_path):
    d = make_run_dir(tmp_path)
    (d / "host.jsonl").write_text('{"k":"host","t":1,"cpu":{},"procs":[]}\n{"k":"ho')
    (d / "proc-9.jsonl").write_text('{"k":"proc","t":1}\n{"k":"st')
    run = load_run(str(d))
    assert len(run.host) == 1 and [r["k"] for r in run.procs[9]] == ["proc"]
    assert len(run.problems) == 2
    assert any("host.jsonl" in p for p in run.problems)
    assert any("proc-9.jsonl" in p for p in run.problems)


def test_load_run_without_meta_but_with_records(tmp_path):
    # whyidle killed before writing meta.json: the trainer's records still make a run
    d = make_run_dir(tmp_path, meta=None)
    write_lines(d / "proc-5.jsonl", ['{"k":"proc","t":1}'])
    run = load_run(str(d))
    assert run.meta == {}
    assert list(run.procs) == [5]


def test_load_run_meta_only(tmp_path):
    d = make_run_dir(tmp_path)
    run = load_run(str(d))
    assert run.meta == META and run.host == [] and run.gpu == [] and run.procs == {}


def test_load_run_missing_dir(tmp_path):
    with pytest.raises(RunDirError, match="no such run directory"):
        load_run(str(tmp_path / "nope"))


def test_load_run_on_a_file(tmp_path):
    f = tmp_path / "meta.json"
    f.write_text("{}")
    with pytest.raises(RunDirError):
        load_run(str(f))


def test_load_run_empty_dir(tmp_path):
    with pytest.raises(RunDirError, match="not a whyidle run directory"):
        load_run(str(tmp_path))


def test_load_run_non_whyidle_dir(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "gpu.jsonl").write_text('{"k":"gpu_notice","t":0,"msg":"x"}\n')  # gpu alone is not a run
    with pytest.raises(RunDirError, match="not a whyidle run directory"):
        load_run(str(tmp_path))


@pytest.mark.parametrize("content", ['{"format": "whyidle.run/1", ', "[1, 2, 3]", "", "null"])
def test_load_run_bad_meta(tmp_path, content):
    d = make_run_dir(tmp_path, meta=None)
    (d / "meta.json").write_text(content)
    with pytest.raises(RunDirError) as err:
        load_run(str(d))
    assert "meta.json" in str(err.value)


@pytest.mark.parametrize("fmt", ["whyidle.run/2", None, "something.else/1"])
def test_load_run_wrong_format(tmp_path, fmt):
    meta = dict(META)
    if fmt is None:
        del meta["format"]
    else:
        meta["format"] = fmt
    d = make_run_dir(tmp_path, meta=meta)
    with pytest.raises(RunDirError, match="unknown format"):
        load_run(str(d))


def test_load_run_damaged_proc_line_is_named_in_problems(tmp_path):
    d = make_run_dir(tmp_path)
    write_lines(d / "proc-77.jsonl", ['{"k":"proc","t":1}', "{broken", '{"k":"exit","t":3}'])
    run = load_run(str(d))
    assert [r["k"] for r in run.procs[77]] == ["proc", "exit"]
    assert run.problems == ["proc-77.jsonl: skipped 1 damaged line (line 2: not a JSON record)"]


def test_unparsable_meta_beside_records_is_ignored_with_a_note(tmp_path):
    d = make_run_dir(tmp_path, meta=None)
    (d / "meta.json").write_text('{"format": "whyidle.run/1", ')
    write_lines(d / "proc-77.jsonl", ['{"k":"proc","t":1}'])
    run = load_run(str(d))
    assert run.meta == {} and run.procs[77]
    assert run.problems == ["meta.json: not valid JSON: ignored (the command, its exit code and the run's start and "
                            "end are unknown)"]


def test_meta_field_with_an_unusable_value_is_dropped_with_a_note(tmp_path):
    d = make_run_dir(tmp_path, meta={**META, "cwd": 1, "command": ["python", None]})
    run = load_run(str(d))
    assert "cwd" not in run.meta and "command" not in run.meta
    assert sorted(run.problems) == ["meta.json: ignored command[1]: null, expected text",
                                    "meta.json: ignored cwd: a number, expected text"]


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.one_of(
    st.lists(st.one_of(st.none(), st.integers(-5, 2 ** 64), st.booleans(), st.floats(), st.text(max_size=2)),
             min_size=13, max_size=13),
    st.lists(st.integers(0, 100), min_size=13, max_size=13).map(lambda r: [r[0], r[1], r[1] + r[2], *r[3:]]),
    st.integers()), max_size=12))
def test_steps_rows_are_read_as_their_step_records_would_be(rows):
    """``add_lite`` (no dict per row) keeps and leaves out the same rows, with the same values,
    as adding each row's ``step`` record (:func:`expand_lite`) one by one."""
    fast, slow = StepTable(), StepTable()
    bad = fast.add_lite({"k": "steps", "rows": rows})
    steps = expand_lite({"k": "steps", "rows": rows})
    assert bad == len(rows) - len(steps) + sum(not slow.add(s) for s in steps)
    assert [dict(r) for r in fast.rows()] == [dict(r) for r in slow.rows()]


def test_a_corrupt_host_file_beside_good_steps_is_left_out_with_a_note(tmp_path):
    d = make_run_dir(tmp_path)
    (d / "host.jsonl").write_bytes(b"\x00\x9f garbage\n" * 20)
    write_lines(d / "proc-5.jsonl", ['{"k":"proc","t":1}', '{"k":"step","t":3,"i":0,"t0":1,"t1":3}'])
    run = load_run(str(d))
    assert run.host == [] and len(run.steps[5]) == 1
    assert run.problems == ["host.jsonl: left out: line 1 and 19 more of 20 lines are not JSON records; the file is "
                            "corrupt"]


def test_a_missing_meta_is_named_in_problems(tmp_path):
    d = make_run_dir(tmp_path, meta=None)
    write_lines(d / "proc-5.jsonl", ['{"k":"proc","t":1}'])
    assert load_run(str(d)).problems == ["meta.json: missing (the command, its exit code and the run's start and end "
                                         "are unknown)"]


def test_a_file_still_being_appended_is_read_up_to_its_size_at_the_start(tmp_path, monkeypatch):
    """``whyidle report`` of a live run: a writer that appends a line for every line read (faster
    than the reader) must not keep it reading forever."""
    from whyidle.record import reader

    path = tmp_path / "proc-1.jsonl"
    write_lines(path, ['{"k":"exit","t":1}'] * 3)

    class Racing:
        def __init__(self, p, mode):
            self.f = open(p, mode)  # noqa: SIM115 - closed in __exit__

        def fileno(self):
            return self.f.fileno()

        def __iter__(self):
            for line in self.f:
                with open(path, "a") as w:
                    w.write('{"k":"exit","t":2}\n')
                yield line

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(reader, "open", Racing, raising=False)
    records, _ = read_jsonl(str(path))
    assert [r["t"] for r in records] == [1, 1, 1]
