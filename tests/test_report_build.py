"""The report object (whyidle.report.build) and the terminal renderers (whyidle.report.terminal)."""

from __future__ import annotations

import io
import json

import pytest

import whyidle
from whyidle.analysis.run import analyze
from whyidle.diagnose import diagnose
from whyidle.record.reader import RunData
from whyidle.report.build import HOST_KEYS, SCHEMA, build_report, notes_of
from whyidle.report.terminal import render, render_brief
from whyidle.analysis.facts import RunFacts

S = 1_000_000_000
MS = 1_000_000
TRAINER, WHYIDLE = 100, 40

META = {"format": "whyidle.run/1", "tool_version": "0.1.0", "name": "t", "command": ["python", "train.py", "--lr", "0.1"],
        "cwd": "/tmp", "hostname": "h", "cpu_count": 4, "started_utc": "2026-11-29T22:00:00Z",
        "anchors": [], "interval_s": 0.25, "stack_hz": 100, "root_pid": TRAINER, "whyidle_pid": WHYIDLE,
        "ended_utc": "2026-11-29T22:00:10Z", "end_t": 20 * S, "exit_code": 0, "signal": None,
        "interrupted": False, "wall_s": 9.5, "run_dir": "/tmp/whyidle-runs/x"}


def host_records():
    out = [{"k": "host_static", "t": 0, "cpu_count": 4, "cpu_count_physical": 2, "mem_total_bytes": 16 * 2**30,
            "clk_tck": 100, "boot_time_s": 0}]
    for j in range(8):  # ticks at 0.5 s … 4.0 s
        t = 0.5 * (j + 1)
        out.append({"k": "host", "t": int(t * S), "cpu": {"user": t, "system": 0.0, "idle": 3 * t, "iowait": 0.0},
                    "percpu_busy_s": [t, 0.0, 0.0, 0.0], "ctx": 0, "disk_read_bytes": 0, "mem_used_bytes": 0,
                    "psi_cpu_us": None, "psi_io_us": None,
                    "procs": [[TRAINER, 1, 0.9 * t, 10**9, 4, 0, 0, 0, 0, 0, 0],
                              [WHYIDLE, 1, 0.01 * t, 10**8, 3, 0, 0, 0, 0, 0, 0]]})
    return out


def proc_records(data_ms=60, fwd_ms=15, bwd_ms=15, n=30, cuda_build=None):
    recs = [{"k": "proc", "t": 0, "pid": TRAINER, "ppid": 1, "argv": ["train.py"], "python": "3.11.7",
             "framework": "torch", "framework_version": "2.4.0", "cuda_build": cuda_build, "threads": 4},
            {"k": "loader", "t": 1, "id": 1, "num_workers": 0, "pin_memory": False, "persistent_workers": False,
             "prefetch_factor": None, "batch_size": 32, "dataset": "ImageFolder", "dataset_len": 1000,
             "mp_context": None, "worker_init_fn": False},
            {"k": "iter", "t": 2, "loader": 1, "t0": 1, "t1": 2}]
    for i in range(n):
        t0 = int(0.5 * S) + i * 100 * MS
        recs.append({"k": "step", "t": t0 + 100 * MS, "i": i, "t0": t0, "t1": t0 + 100 * MS, "by": "optimizer",
                     "data": data_ms * MS, "fwd": fwd_ms * MS, "bwd": bwd_ms * MS, "opt": 5 * MS, "eval": 0, "batches": 1,
                     "samples": 32, "cpu": 95 * MS, "data_cpu": 57 * MS, "boundary": False})
    recs.append({"k": "stacks", "t": int(2 * S), "hz": 100, "n": 100,
                 "sites": [["data", "train.py:20 load_image", "PIL/Image.py:300 open", 60],
                           ["forward", "train.py:40 forward", "torch/nn/functional.py:10 linear", 40]]})
    return recs


def gpu_records():
    return [{"k": "gpu_static", "t": 0, "ts_domain": "epoch", "cuda_visible_devices": None,
             "devices": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-a", "memory_total_bytes": 150 * 10**9,
                          "compute_capability": [9, 0], "driver_version": "550.54.15",
                          "cuda_driver_version": "12.4", "gpm_supported": True}]},
            {"k": "gpu_util", "t": int(4 * S), "dev": 0, "type": "gpu",
             "samples": [[int(0.5 * S) + k * 100 * MS, 40.0, 0] for k in range(1, 30)]},
            {"k": "gpu_state", "t": int(2 * S), "dev": 0, "mem_used_bytes": 10 * 2**30,
             "mem_total_bytes": 150 * 10**9, "sm_clock_mhz": 1980, "power_w": 300.0, "clocks_event_reasons": 0,
             "util_pct": 40, "mem_util_pct": 10}]


def run_data(meta=META, gpu=None, procs=None, host=None):
    return RunData(path="/tmp/x", meta=dict(meta) if meta is not None else {},
                   host=host_records() if host is None else host, gpu=gpu or [],
                   procs={TRAINER: proc_records()} if procs is None else procs, problems=[])


def report_of(run, problems=None):
    facts = analyze(run)
    verdict, findings = diagnose(facts)
    return build_report(facts, verdict, findings, problems)


def assert_report_contract(rep):
    assert rep["schema"] == SCHEMA == "whyidle.report/1"
    assert rep["tool_version"] == whyidle.__version__
    assert isinstance(rep["command"], list) and all(isinstance(c, str) for c in rep["command"])
    assert rep["framework"] in ("torch", "keras", "tensorflow", "none")
    assert {"kind", "name", "compute_capability", "memory_total_bytes"} <= set(rep["device"])
    assert isinstance(rep["verdict"], str)
    assert isinstance(rep["findings"], list)
    for f in rep["findings"]:
        assert {"id", "severity", "title", "summary", "evidence", "est_speedup", "fix"} <= set(f)
        assert set(f["fix"]) >= {"text", "code", "docs"}
    if rep["findings"] and rep["verdict"] != "unknown":
        assert rep["findings"][0]["id"] == rep["verdict"]
    m = rep["metrics"]
    assert {"steps", "wall_s", "samples_per_s", "batch_size", "step_time_s", "shares", "host", "gpu"} <= set(m)
    json.dumps(rep)  # plain JSON


def test_report_contract_cpu_run():
    rep = report_of(run_data())
    assert_report_contract(rep)
    assert rep["source"] == "run"
    assert rep["command"] == ["python", "train.py", "--lr", "0.1"]
    assert rep["framework"] == "torch"
    assert rep["device"]["kind"] == "cpu"
    assert rep["device"]["memory_total_bytes"] == 16 * 2**30
    assert rep["verdict"] == "input_bound"
    assert rep["findings"][0]["est_speedup"] == pytest.approx(2.5)
    m = rep["metrics"]
    assert m["steps"] == 30 and m["steps_analyzed"] == 28
    assert m["wall_s"] == 9.5  # the command's wall time from meta
    assert m["train_wall_s"] == pytest.approx(2.8)
    assert m["samples_per_s"] == pytest.approx(320.0)
    assert m["batch_size"] == 32
    assert set(m["step_time_s"]) == {"p50", "p90", "mean"}
    assert m["step_time_s"] == {"p50": pytest.approx(0.1), "p90": pytest.approx(0.1), "mean": pytest.approx(0.1)}
    assert {"data_wait", "forward", "backward", "optimizer", "other_host"} <= set(m["shares"])
    assert m["shares"]["data_wait"] == pytest.approx(0.6)
    assert m["shares"]["other_host"] == pytest.approx(0.05)
    assert m["data_cpu_share"] == pytest.approx(0.95)
    assert m["gpu"] is None  # never zeros
    assert m["gpu_step_ms"] is None
    assert set(m["host"]) == set(HOST_KEYS)
    assert m["host"]["cores"] == 4
    assert m["host"]["trainer_cores"] == pytest.approx(0.9)
    assert m["host"]["cpu_busy_share"] == pytest.approx(0.25)
    assert rep["loader"]["num_workers"] == 0
    assert rep["run"] == {"run_dir": "/tmp/whyidle-runs/x", "started_utc": "2026-11-29T22:00:00Z",
                          "ended_utc": "2026-11-29T22:00:10Z", "exit_code": 0, "signal": None, "interrupted": False}
    assert any("No NVIDIA GPU was observed" in n for n in rep["notes"])
    assert any("first 2 step(s) were treated as warm-up" in n for n in rep["notes"])


def test_report_with_gpu():
    rep = report_of(run_data(gpu=gpu_records()))
    assert_report_contract(rep)
    assert rep["device"]["kind"] == "cuda" and rep["device"]["name"] == "NVIDIA H200"
    gpu = rep["metrics"]["gpu"]
    assert gpu is not None
    assert gpu["util_mean"] == pytest.approx(40.0)
    assert not any("No NVIDIA GPU" in n for n in rep["notes"])


def test_report_without_steps():
    procs = {TRAINER: [r for r in proc_records() if r["k"] != "step"]}
    rep = report_of(run_data(procs=procs))
    assert_report_contract(rep)
    assert rep["verdict"] == "unknown"
    assert rep["findings"][0]["id"] == "no_steps"
    m = rep["metrics"]
    assert m["steps"] == 0 and m["steps_analyzed"] == 0
    assert m["step_time_s"] is None and m["shares"] is None and m["samples_per_s"] is None
    assert m["host"] is not None  # host samples over the whole run
    assert m["wall_s"] == 9.5


def test_report_without_anything_but_meta():
    rep = report_of(RunData(path="/x", meta=dict(META), host=[], gpu=[], procs={}, problems=[]))
    assert_report_contract(rep)
    assert rep["framework"] == "none"
    assert rep["metrics"]["host"] is None and rep["metrics"]["gpu"] is None
    assert rep["findings"][0]["id"] == "no_steps"


def test_floats_are_rounded():
    facts = analyze(run_data())
    facts.step["samples_per_s"] = 1234.5678
    facts.step["shares"]["forward"] = 0.123456789
    rep = build_report(facts, "device_bound", [])
    assert rep["metrics"]["steady_samples_per_s"] == 1234.6
    assert rep["metrics"]["shares"]["forward"] == 0.1235


# -- notes ---------------------------------------------------------------------------------------

def facts_with_meta(**kw):
    meta = dict(META)
    meta.update(kw)
    return RunFacts(meta=meta, steps_info={"total": 10, "warmup": 2, "boundary_excluded": 0, "boundary_s": 0.0},
                    gpu=None, gpu_records_notices=[], notices=[], other_trainers=[])


def test_note_signal_with_ctrl_c():
    notes = notes_of(facts_with_meta(signal=2, interrupted=True, exit_code=None), [])
    assert notes[0] == "The command was ended by signal 2 (Ctrl-C); this report covers the steps before it."


def test_note_signal_kill():
    notes = notes_of(facts_with_meta(signal=9, exit_code=None), [])
    assert notes[0] == "The command was ended by signal 9; this report covers the steps before it."


def test_note_crash_exit_code():
    notes = notes_of(facts_with_meta(exit_code=1), [])
    assert notes[0] == "The command exited with code 1; this report covers the steps before it."


def test_note_interrupted_without_signal():
    # SIGINT arrived but the command caught it and exited 0: say so, not "interrupted"
    notes = notes_of(facts_with_meta(interrupted=True), [])
    assert notes[0].startswith("whyidle received SIGINT") and "exited normally" in notes[0]


def test_note_unfinished_run():
    meta = dict(META)
    del meta["ended_utc"]
    meta["exit_code"] = None
    notes = notes_of(RunFacts(meta=meta, gpu=None), [])
    assert notes[0].startswith("The run did not finish cleanly")


def test_clean_exit_has_no_exit_note():
    notes = notes_of(facts_with_meta(), [])
    assert not any("exited" in n or "signal" in n or "interrupted" in n or "finish" in n for n in notes)


def test_notes_problems_first_then_the_rest():
    facts = facts_with_meta(exit_code=3)
    facts.steps_info.update(boundary_excluded=2, boundary_s=1.234)
    facts.other_trainers = [{"pid": 200, "steps": 50, "samples_per_s": 10.0}]
    facts.primary = 100
    facts.gpu_records_notices = [{"k": "gpu_notice", "t": 0, "msg": "NVML Shared Library Not Found"}]
    facts.notices = ["PyTorch instrumentation disabled after an error in x"]
    notes = notes_of(facts, ["host.jsonl: skipped a truncated last line"])
    assert notes == [
        "host.jsonl: skipped a truncated last line",
        "The command exited with code 3; this report covers the steps before it.",
        "The first 2 step(s) were treated as warm-up and left out of the shares.",
        "2 step(s) holding an epoch boundary or evaluation (1.23 s) were left out of the steady-state shares; the "
        "wall-time split counts that time.",
        "Another training process (pid 200) ran 50 steps; the report describes pid 100.",
        "No NVIDIA GPU was observed (NVML Shared Library Not Found): GPU metrics are null.",
        "PyTorch instrumentation disabled after an error in x",
    ]


def test_the_boundary_note_names_what_the_left_out_steps_held():
    facts = facts_with_meta()
    facts.steps_info.update(boundary_excluded=19, boundary_s=7.25)
    part = {"s": 7.0, "share": 0.3, "count": 19}
    facts.time = {"parts": {"checkpoint": part, "evaluation": dict(part, count=0)}}
    assert "19 step(s) holding checkpoint saving (7.25 s)" in " ".join(notes_of(facts, []))
    facts.time["parts"]["logging"] = part
    assert "holding checkpoint saving or tracker logging" in " ".join(notes_of(facts, []))


def test_a_long_teardown_gets_a_note_naming_where_it_went():
    facts = facts_with_meta()
    site = {"site": "train.py:51 <module>", "function": "train.py <module>",
            "leaf": "keras/src/utils/traceback_utils.py:117 error_handler", "seconds": 8.8}
    facts.time = {"parts": {"teardown": {"s": 8.8, "share": 0.36, "count": 1, "sites": [site]}}}
    note = next(n for n in notes_of(facts, []) if n.startswith("After the last training step"))
    assert "8.8 s (36% of the wall time)" in note and "train.py:51 <module> inside keras/src" in note
    facts.time["parts"]["teardown"].update(s=0.6, share=0.05)  # interpreter shutdown: no note
    assert not any(n.startswith("After the last") for n in notes_of(facts, []))


def test_gpu_notices_pass_through_when_a_gpu_was_seen():
    facts = facts_with_meta()
    facts.gpu = {"util_mean": 50.0}
    facts.gpu_records_notices = [{"k": "gpu_notice", "t": 0, "msg": "GPM not supported"}]
    notes = notes_of(facts, [])
    assert "GPM not supported" in notes
    assert not any("No NVIDIA GPU" in n for n in notes)


def test_report_notes_include_reader_problems():
    rep = report_of(run_data(meta=dict(META, signal=15, exit_code=None)), ["proc-100.jsonl: skipped a truncated last line"])
    assert rep["notes"][0] == "proc-100.jsonl: skipped a truncated last line"
    assert rep["notes"][1].startswith("The command was ended by signal 15")


# -- terminal ------------------------------------------------------------------------------------

def rendered(report, brief=False) -> str:
    buf = io.StringIO()
    (render_brief if brief else render)(report, file=buf, width=100)
    return buf.getvalue()


def test_render_input_bound_report():
    rep = report_of(run_data())
    out = rendered(rep)
    assert "Verdict: INPUT-BOUND: the step waits for data" in out
    assert "2.50× faster" in out
    assert "python train.py --lr 0.1" in out
    assert "GPU none observed" in out
    assert "Fix:" in out and "num_workers=" in out
    assert "data wait 60%" in out
    assert "run directory: /tmp/whyidle-runs/x" in out
    assert all(len(line) <= 100 for line in out.splitlines())


def test_render_brief_prints_verdict_and_summaries():
    rep = report_of(run_data())
    out = rendered(rep, brief=True)
    assert out.splitlines()[0].startswith("Verdict: INPUT-BOUND")
    assert "[critical] The training loop waits for the next batch 60%" in out
    assert "Fix:" not in out


def test_render_with_gpu():
    rep = report_of(run_data(gpu=gpu_records()))
    out = rendered(rep)
    assert "GPU util 40% (NVML, samples)" in out
    assert "Verdict:" in out


def test_render_unknown_and_signal():
    procs = {TRAINER: [r for r in proc_records() if r["k"] != "step"]}
    rep = report_of(run_data(meta=dict(META, signal=9, exit_code=None), procs=procs))
    out = rendered(rep)
    assert "Verdict: UNKNOWN: no training steps seen" in out  # the reason, from the no_steps finding
    assert "ended by signal 9" in out
    assert "Verdict: UNKNOWN" in rendered(rep, brief=True)


def test_render_device_bound():
    procs = {TRAINER: proc_records(data_ms=1, fwd_ms=50, bwd_ms=40)}
    rep = report_of(run_data(procs=procs))
    assert rep["verdict"] == "device_bound"
    out = rendered(rep)
    assert "Verdict: DEVICE-BOUND: nothing upstream limits the device" in out
    assert "[info]" in rendered(rep, brief=True)


def test_render_minimal_report():
    rep = {"schema": SCHEMA, "verdict": "device_bound", "findings": [], "metrics": {}, "command": []}
    out = rendered(rep)
    assert "(no command)" in out and "DEVICE-BOUND" in out
    assert "DEVICE-BOUND" in rendered(rep, brief=True)


def test_render_gpu_without_util_samples():
    rep = report_of(run_data(gpu=gpu_records()[:1]))  # gpu_static only: util_mean None
    assert rep["metrics"]["gpu"] is not None and rep["metrics"]["gpu"]["util_mean"] is None
    out = rendered(rep)
    assert "Verdict:" in out
