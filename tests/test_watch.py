"""``whyidle.watch()`` (issue 33): one part of a running program observed, reported, and every hook of
whyidle's taken out again, whatever way the block ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import finding, run_whyidle

TESTS = os.path.dirname(os.path.abspath(__file__))

#: A program observing three blocks and a decorated function, printing one JSON line per check.
PROGRAM = textwrap.dedent('''
    import copy, io, json, pickle, sys, time
    sys.path.insert(0, {tests!r})
    import torch, whyidle
    from torch.utils.data import DataLoader, Dataset, TensorDataset
    from leftovers import leftovers
    torch.set_num_threads(1)

    class Slow(Dataset):  # per-sample Python work in the training process (num_workers=0)
        def __len__(self):
            return 192

        def __getitem__(self, i):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.004:
                pass
            return torch.randn(64), i % 2

    def user_hook(module, args, out):
        return None

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    model.register_forward_hook(user_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = {{k: v for k, v in vars(torch.nn.Module).items()}}

    def train(loader):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return float(loss)

    def out(**kw):
        print("CHECK " + json.dumps(kw), flush=True)

    with whyidle.watch(name="slow", out="{tmp}/a", html=False, quiet=True) as w:
        model.register_forward_hook(user_hook)  # registered while watched: the program's hook again after
        train(DataLoader(Slow(), batch_size=8))
    hooks_ok = len(model._forward_hooks) == 2 and all(h is user_hook for h in model._forward_hooks.values())
    out(block="a", verdict=w.report["verdict"], steps=w.report["metrics"]["steps"], run_dir=w.run_dir,
        left=leftovers([model]), hooks_ok=hooks_ok,
        module_dict=[k for k, v in vars(torch.nn.Module).items() if before.get(k) is not v])
    buf = io.BytesIO()
    torch.save(model, buf)
    copy.deepcopy(model)
    pickle.dumps(model._forward_hooks)

    big_loader = DataLoader(TensorDataset(torch.randn(512, 64), torch.randint(0, 2, (512,))),
                            batch_size=32)  # built before the watch: found by its name
    with whyidle.watch(out="{tmp}/b", html=False, quiet=True) as w2:
        for x, y in big_loader:
            model(x).sum().backward()
    out(block="b", verdict=w2.report["verdict"], steps=w2.report["metrics"]["steps"],
        batch=w2.report["metrics"]["batch_size"], created=w2.report["loader"]["created"],
        lead=(w2.report["loader"]["call"] or {{}}).get("lead"), left=leftovers([model]))

    try:
        with whyidle.watch(out="{tmp}/c", html=False, quiet=True) as w3:
            train(DataLoader(TensorDataset(torch.randn(64, 64), torch.randint(0, 2, (64,))), batch_size=8))
            raise ValueError("diverged")
    except ValueError as exc:
        out(block="c", raised=str(exc), notes=w3.report["notes"], left=leftovers([model]))

    w4 = whyidle.watch(out="{tmp}/d", html=False, quiet=True)

    @w4
    def fit():
        return train(DataLoader(TensorDataset(torch.randn(128, 64), torch.randint(0, 2, (128,))), batch_size=16))

    value = fit()
    out(block="d", value=value, steps=w4.report["metrics"]["steps"], left=leftovers([model]))
''')


@pytest.mark.slow
def test_watch_blocks_report_and_leave_nothing(tmp_path):
    """Three blocks and a decorated function in one process: each has its own run directory and
    report (an input-bound block, a block of another batch size, a block that raises: its report
    notes it and the exception propagates); after each, no hook, wrapper, thread, signal handler or
    import hook of whyidle's is left, the program's own hooks are its functions again (pickle,
    ``torch.save`` and ``deepcopy`` work)."""
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.format(tests=TESTS, tmp=str(tmp_path)))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = {c["block"]: c for c in (json.loads(line[6:]) for line in proc.stdout.splitlines()
                                      if line.startswith("CHECK "))}
    assert set(checks) == {"a", "b", "c", "d"}, proc.stdout + proc.stderr[-2000:]
    a, b, c, d = (checks[k] for k in "abcd")
    assert a["verdict"] == "input_bound" and a["steps"] == 24
    assert a["hooks_ok"] and not a["module_dict"]
    assert b["steps"] == 16 and b["batch"] == 32  # its own report, not the first block's
    line = PROGRAM.splitlines().index("big_loader = DataLoader(TensorDataset(torch.randn(512, 64), "
                                      "torch.randint(0, 2, (512,))),") + 1
    assert b["created"][0] == f"prog.py:{line} <module>" and b["lead"] == "big_loader = ", b
    assert c["raised"] == "diverged"
    assert any("raised ValueError: diverged" in n for n in c["notes"]), c["notes"]
    assert d["steps"] == 8 and isinstance(d["value"], float)
    for check in checks.values():
        assert check["left"] == [], check
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    f = finding(report, "input_bound")
    assert "prog.py" in json.dumps(f["evidence"]), f["evidence"]
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["scope"] == "watch" and meta["root_pid"] != meta["whyidle_pid"]
    assert "[whyidle]" not in proc.stderr  # quiet: no live status, no problem to say


@pytest.mark.slow
def test_watch_inside_whyidle_run_leaves_the_run_its_process(tmp_path):
    """A program run under ``whyidle run`` that calls ``whyidle.watch()``: the process is observed
    already, the watch says so in one line and the block runs; the run's report covers it."""
    script = tmp_path / "inner.py"
    script.write_text(textwrap.dedent('''
        import torch, whyidle
        model = torch.nn.Linear(8, 2)
        with whyidle.watch(html=False) as w:
            for _ in range(30):
                model(torch.randn(4, 8)).sum().backward()
        print("REPORT", w.report is None, w.run_dir is None)
    '''))
    proc = run_whyidle(["run", "-q", "--no-html", "--out", str(tmp_path / "run"), "--", sys.executable, str(script)],
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "REPORT True True" in proc.stdout
    assert "observed already" in proc.stderr
    assert (tmp_path / "run" / "report.json").exists()


def test_watch_with_a_bad_run_directory_runs_the_block_unobserved(tmp_path, capsys):
    """``out`` that cannot be a run directory: one ``[whyidle]`` line, the block runs, no report,
    nothing installed."""
    import whyidle
    from whyidle.instrument import agent

    blocker = tmp_path / "file"
    blocker.write_text("x")
    ran = []
    with whyidle.watch(out=str(blocker / "run"), quiet=True) as w:
        ran.append(agent.current())
    assert ran == [None] and w.report is None and w.run_dir is None
    err = capsys.readouterr().err
    assert err.count("[whyidle]") == 1 and "not writable" in err


def test_magic_options():
    pytest.importorskip("IPython")
    from whyidle.run.magic import UsageError, parse_options

    assert parse_options("--name exp3 --no-html --stack-hz 0 -q") == {
        "name": "exp3", "out": None, "stack_hz": 0.0, "interval_s": 0.25, "html": False, "json_path": None,
        "quiet": True}
    for bad in ("--stack-hz fast", "--bogus", "--interval 0", "--name 'unclosed"):
        with pytest.raises(UsageError, match="%%whyidle"):
            parse_options(bad)


@pytest.mark.slow
def test_a_killed_program_leaves_a_readable_run_and_no_sampler(tmp_path):
    """``kill -9`` of a program inside ``watch()``: the sampler helper notices (its stdin closes) and
    exits, and ``whyidle report`` reads what was recorded (the last half second at most is lost)."""
    import psutil

    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f'''
        import time, torch, whyidle
        model = torch.nn.Linear(64, 2)
        with whyidle.watch(out={str(tmp_path / "run")!r}, html=False, quiet=True):
            for step in range(100000):
                model(torch.randn(8, 64)).sum().backward()
                time.sleep(0.01)
                if step == 50:
                    print("STEPS", flush=True)
    '''))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "STEPS"
        helpers = [p for p in psutil.Process(proc.pid).children() if "whyidle.sampling.helper" in " ".join(p.cmdline())]
        assert len(helpers) == 1
        time.sleep(1.0)  # a flush of the steps
        proc.kill()
        proc.wait(timeout=10)
        helpers[0].wait(timeout=10)  # gone with its observed process
    finally:
        proc.kill()
    done = run_whyidle(["report", str(tmp_path / "run"), "--json", "-"])
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout[done.stdout.index("{"):])
    assert report["metrics"]["steps"] >= 50
