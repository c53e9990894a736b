"""On-demand deep traces (issue 34, ``src/whyidle/instrument/deep_trace.py``): a request in
``RUN_DIR/control/trace.json`` opens a ``torch.profiler`` window of N training steps in the
trainer, whose trace lands in ``RUN_DIR/traces/`` with a ``trace_window`` record; the program's
own profiler always wins.

The in-process tests drive :class:`DeepTrace` at hand-made step boundaries (real torch profiler,
a stand-in agent); the ``slow`` ones run real training scripts under ``whyidle run`` and write
the request themselves once the trainer's ``proc-<pid>.jsonl`` exists (the parent's side,
``run/rolling.py``, is not needed for them).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from conftest import SCENARIOS, whyidle_cmd
from whyidle.instrument import deep_trace, patches
from whyidle.instrument.deep_trace import DISCARDED, STEPPED_ASIDE


# -- in-process ------------------------------------------------------------------------------------

class _Agent:
    def __init__(self, run_dir):
        self.run_dir = str(run_dir)
        self.t_start = time.monotonic_ns()
        self.records = []
        self.notices = []
        self.on_exit = []
        self.disabled = False

    def record(self, rec):
        self.records.append(rec)

    def notice(self, msg):
        self.notices.append(msg)


class _Inst:
    step = 0
    off = False
    trace_due = 1 << 62
    deep = None


@pytest.fixture
def deep(tmp_path):
    """A DeepTrace with its wrappers in torch's profiler class (taken out afterwards)."""
    agent = _Agent(tmp_path)
    inst = _Inst()
    d = deep_trace.install(agent, torch, inst)
    yield d
    if d.prof is not None:
        d._drop_window()
    patches.restore()


def request(run_dir, **fields):
    os.makedirs(os.path.join(run_dir, "control"), exist_ok=True)
    req = {"id": "t1", "steps": 3, "ranks": None, "pids": None, "reason": "test", "t": time.monotonic_ns(), **fields}
    path = os.path.join(run_dir, "control", "trace.json")
    with open(path + ".tmp", "w") as f:
        json.dump(req, f)
    os.replace(path + ".tmp", path)


def step(d, model, x):
    """One training step, then its boundary as ``TorchInstrument.end_step`` calls it."""
    model(x).sum().backward()
    now = time.monotonic_ns()
    if now >= d.inst.trace_due:
        now = d.boundary(now)
    d.inst.step += 1
    return now


def windows(agent):
    return [r for r in agent.records if r["k"] == "trace_window"]


def profiler_steps(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))


def test_a_request_traces_the_next_steps_once(deep, tmp_path):
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    step(deep, model, x)  # the first look: nothing asked yet
    assert deep.inst.trace_due > time.monotonic_ns()  # the next look in about a second
    request(tmp_path, steps=3)
    deep.inst.trace_due = 0  # not waiting the second out
    ends = [step(deep, model, x) for _ in range(6)]
    [rec] = windows(deep.agent)
    assert rec["error"] is None and rec["id"] == "t1" and rec["reason"] == "test"
    assert rec["steps"] == 3 and rec["first_step"] == 2  # opened at the boundary ending step 1
    assert rec["t0"] == ends[0] and rec["t1"] == ends[3]  # the stop and export end the last traced step
    assert rec["rank"] is None and rec["world_size"] is None
    assert rec["file"] == f"traces/t1-{os.getpid()}.pt.trace.json"
    assert profiler_steps(tmp_path / rec["file"]) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert oct(os.stat(tmp_path / rec["file"]).st_mode & 0o777) == oct(0o600)
    assert rec["stop_s"] > 0 and rec["export_s"] > 0
    assert not torch.autograd.profiler._is_profiler_enabled
    deep.inst.trace_due = 0
    step(deep, model, x)  # the same request again: served already
    os.utime(tmp_path / "control" / "trace.json", ns=(1, 1))  # even when the file looks changed
    deep.inst.trace_due = 0
    step(deep, model, x)
    assert len(windows(deep.agent)) == 1


@pytest.mark.parametrize("fields, served", [
    ({"pids": [1]}, False),  # another process
    ({"ranks": [1]}, False),  # another rank (outside a distributed job this process is rank 0)
    ({"ranks": [0, 1]}, True),
    ({"t": 0}, False),  # written before this process started: not meant for it
    ({"id": ""}, False),
])
def test_a_request_is_served_by_the_processes_it_names(deep, tmp_path, fields, served):
    request(tmp_path, **fields)
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    deep.inst.trace_due = 0
    for _ in range(5):
        step(deep, model, x)
    assert len(windows(deep.agent)) == (1 if served else 0)


def test_the_steps_asked_are_capped(deep, tmp_path):
    request(tmp_path, steps=10_000)
    deep.inst.trace_due = 0
    step(deep, torch.nn.Linear(2, 2), torch.randn(1, 2))
    assert deep.steps == deep_trace.MAX_STEPS
    deep._drop_window()


def test_a_failed_export_is_a_record_not_an_error(deep, tmp_path):
    (tmp_path / "traces").write_text("a file where the folder goes")
    request(tmp_path, steps=2)
    deep.inst.trace_due = 0
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    for _ in range(4):
        step(deep, model, x)
    [rec] = windows(deep.agent)
    assert rec["file"] is None and rec["error"].startswith("the trace was not written")
    assert rec["steps"] == 2
    assert not torch.autograd.profiler._is_profiler_enabled


def test_a_cut_export_is_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"name": "a"')
    with pytest.raises(OSError, match="cut short"):
        deep_trace._check_complete(str(path))
    path.write_text("")
    with pytest.raises(OSError, match="empty"):
        deep_trace._check_complete(str(path))


def test_the_programs_running_profiler_makes_whyidle_step_aside(deep, tmp_path):
    from torch.profiler import profile, schedule

    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    request(tmp_path)
    with profile() as prof:
        deep.inst.trace_due = 0
        step(deep, model, x)
    [rec] = windows(deep.agent)
    assert rec["error"] == STEPPED_ASIDE and rec["file"] is None and rec["steps"] == 0
    assert prof.events()  # the program's trace is its own
    # a schedule's warm-up (prepared, not started yet) counts as running too
    request(tmp_path, id="t2")
    prof = profile(schedule=schedule(wait=0, warmup=1, active=1))
    prof.start()
    deep.inst.trace_due = 0
    step(deep, model, x)
    prof.stop()
    assert [r["error"] for r in windows(deep.agent)] == [STEPPED_ASIDE, STEPPED_ASIDE]


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_the_program_starting_its_profiler_ends_whyidles_window(deep, tmp_path):
    from torch.profiler import ProfilerActivity, profile, schedule

    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    request(tmp_path, steps=50)
    deep.inst.trace_due = 0
    step(deep, model, x)
    step(deep, model, x)
    assert deep.prof is not None
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=3, repeat=1)) as prof:
        for _ in range(3):
            step(deep, model, x)
            prof.step()
    [rec] = windows(deep.agent)
    assert rec["error"] == DISCARDED and rec["file"] is None and rec["steps"] == 1
    assert deep.prof is None and deep.inst.trace_due < 1 << 62  # and looks again from its next boundary
    prof.export_chrome_trace(str(tmp_path / "own.json"))
    assert profiler_steps(tmp_path / "own.json") == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]


def test_the_wrappers_come_out_with_restore(tmp_path):
    cls = torch.autograd.profiler.profile
    before = {name: cls.__dict__[name] for name in ("_prepare_trace", "_start_trace", "__exit__")}
    deep_trace.install(_Agent(tmp_path), torch, _Inst())
    assert cls.__dict__["_start_trace"] is not before["_start_trace"]
    patches.restore()
    assert {name: cls.__dict__[name] for name in before} == before


def test_the_program_ending_inside_the_window_keeps_what_was_traced(deep, tmp_path):
    request(tmp_path, steps=20)
    deep.inst.trace_due = 0
    model, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    for _ in range(3):
        step(deep, model, x)
    deep.at_exit()
    [rec] = windows(deep.agent)
    assert rec["error"] == "the program ended after 2 of 20 steps" and rec["steps"] == 2
    assert len(profiler_steps(tmp_path / rec["file"])) == 3  # the one cut by the exit too


# -- real runs -------------------------------------------------------------------------------------

def _records(run_dir, kind=None):
    out = []
    for path in glob.glob(os.path.join(run_dir, "proc-*.jsonl")):
        with open(path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if kind is None or rec.get("k") == kind:
                    out.append({**rec, "_file": os.path.basename(path)})
    return out


def _launch(tmp_path, cmd, name="run"):
    run_dir = str(tmp_path / name)
    proc = subprocess.Popen(whyidle_cmd("run", "-q", "--out", run_dir, "--no-html", "--", *cmd),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, run_dir


def _wait_for(cond, timeout=60.0, what="it"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _steps_of(run_dir):
    """{pid file: {i: (t0, t1)}} from the trainers' step records and lite step rows."""
    out: dict = {}
    for rec in _records(run_dir):
        if rec["k"] == "step":
            out.setdefault(rec["_file"], {})[rec["i"]] = (rec["t0"], rec["t1"])
        elif rec["k"] == "steps":
            for row in rec["rows"]:
                out.setdefault(rec["_file"], {})[row[0]] = (row[1], row[2])
    return out


@pytest.mark.slow
def test_a_request_during_a_run_writes_a_trace_whyidle_trace_reads(tmp_path):
    from whyidle.pipeline import trace_report

    proc, run_dir = _launch(tmp_path, [sys.executable, os.path.join(SCENARIOS, "midrun_regression.py"),
                                       "--seconds", "12", "--after", "100"])
    try:
        _wait_for(lambda: _records(run_dir, "step"), what="the trainer's first steps")
        request(run_dir, id="deep-1", steps=10, reason="a test asked")
        [rec] = _wait_for(lambda: _records(run_dir, "trace_window"), timeout=30, what="the trace_window record")
        request(run_dir, id="deep-2", steps=5, pids=[proc.pid])  # whyidle's own pid: no trainer's
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert [r["id"] for r in _records(run_dir, "trace_window")] == ["deep-1"]
    assert rec["error"] is None and rec["reason"] == "a test asked" and rec["steps"] == 10
    pid = int(rec["_file"][len("proc-"):-len(".jsonl")])
    assert rec["file"] == f"traces/deep-1-{pid}.pt.trace.json" and rec["rank"] is None
    steps = _steps_of(run_dir)[rec["_file"]]
    first, last = rec["first_step"], rec["first_step"] + rec["steps"] - 1
    assert steps[first][0] == rec["t0"] and steps[last][1] == rec["t1"]
    report = trace_report(os.path.join(run_dir, rec["file"]))
    assert report["source"] == "trace" and report["framework"] == "torch"
    assert report["metrics"]["steps"] == 10
    assert "Traceback" not in err


_OWN_PROFILER = """
import os, sys, time, json
import torch
from torch.profiler import ProfilerActivity, profile, schedule
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 2, (32,))

def train_step():
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.005)

MODE = sys.argv[1]
OUT = sys.argv[2]
end = time.monotonic() + float(sys.argv[3])
if MODE == "running":  # the program profiles its whole run: whyidle must stay out
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        while time.monotonic() < end:
            train_step()
    print("RESULT", json.dumps({"events": len(prof.events())}), flush=True)
else:  # the program starts its own profiler when it sees one running (whyidle's window)
    own = None
    while time.monotonic() < end:
        train_step()
        if own is None and torch.autograd.profiler._is_profiler_enabled:
            with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=5, repeat=1)) as prof:
                for _ in range(5):
                    train_step()
                    prof.step()
            prof.export_chrome_trace(OUT)
            own = OUT
    print("RESULT", json.dumps({"own": own}), flush=True)
"""


def _own_profiler_run(tmp_path, mode, steps):
    script = tmp_path / "own.py"
    script.write_text(textwrap.dedent(_OWN_PROFILER))
    own = str(tmp_path / "own.pt.trace.json")
    proc, run_dir = _launch(tmp_path, [sys.executable, str(script), mode, own, "8"], name=mode)
    try:
        _wait_for(lambda: _records(run_dir, "step"), what="the trainer's first steps")
        request(run_dir, id="t1", steps=steps)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[len("RESULT "):])
    return result, _records(run_dir, "trace_window"), err, own


@pytest.mark.slow
def test_whyidle_steps_aside_for_the_programs_own_profiler(tmp_path):
    result, recs, err, _ = _own_profiler_run(tmp_path, "running", 10)
    assert [(r["error"], r["file"], r["steps"]) for r in recs] == [(STEPPED_ASIDE, None, 0)]
    assert result["events"] > 0 and "Traceback" not in err


@pytest.mark.slow
def test_the_program_starting_its_profiler_in_whyidles_window_gets_a_complete_trace(tmp_path):
    result, recs, err, own = _own_profiler_run(tmp_path, "start", 100)
    assert [(r["error"], r["file"]) for r in recs] == [(DISCARDED, None)]
    assert result["own"] == own and "Traceback" not in err
    assert profiler_steps(own) == [f"ProfilerStep#{i}" for i in range(5)]
    assert not os.path.isdir(os.path.join(tmp_path, "start", "traces")) or not os.listdir(
        os.path.join(tmp_path, "start", "traces"))


@pytest.mark.slow
def test_each_rank_of_a_gloo_job_traces_with_its_rank(tmp_path):
    from whyidle.record.kineto import read_trace

    # 4,000 steps of ~2 ms: ~9 s of training, so the request lands while both ranks still step (400
    # steps trained in 1.1 s, and under a loaded CI the request could come after the last one)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.join(SCENARIOS, "ddp_straggler.py"), "--kind", "loader", "--fixed", "--steps", "4000"]
    proc, run_dir = _launch(tmp_path, cmd, name="ddp")
    try:
        _wait_for(lambda: len({r["_file"] for r in _records(run_dir, "step")}) == 2, what="both ranks' steps")
        request(run_dir, id="r", steps=5)
        _wait_for(lambda: len(_records(run_dir, "trace_window")) == 2, timeout=60, what="both ranks' records")
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    recs = sorted(_records(run_dir, "trace_window"), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["error"], r["steps"]) for r in recs] == [(0, 2, None, 5), (1, 2, None, 5)]
    for r in recs:
        assert f"-rank{r['rank']}-" in r["file"]
        assert read_trace(os.path.join(run_dir, r["file"])).rank == r["rank"]  # torch's distributedInfo


_CUDA_LOOP = """
import time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(256, 512, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
end = time.monotonic() + 10
while time.monotonic() < end:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.002)
"""


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU usable by PyTorch")
def test_a_cuda_trainers_window_holds_its_kernels(tmp_path):
    """Once CUDA is initialized in the trainer the window records CUDA activity too: the trace
    ``whyidle trace`` reads has the steps' kernels."""
    from whyidle.pipeline import trace_report

    script = tmp_path / "cuda_loop.py"
    script.write_text(_CUDA_LOOP)
    proc, run_dir = _launch(tmp_path, [sys.executable, str(script)], name="cuda")
    try:
        _wait_for(lambda: _records(run_dir, "step"), what="the trainer's first steps")
        request(run_dir, id="g", steps=10)
        [rec] = _wait_for(lambda: _records(run_dir, "trace_window"), timeout=60, what="the trace_window record")
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert rec["error"] is None and rec["steps"] == 10
    report = trace_report(os.path.join(run_dir, rec["file"]))
    assert report["metrics"]["steps"] == 10 and report["metrics"]["gpu_events"] > 0
