"""`whyidle run` as a process: exit codes, output, signals, crashes, kills, bootstrap reach."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest

from conftest import finding, observe, run_whyidle, whyidle_cmd, write_script

pytestmark = pytest.mark.slow


def _steps(report):
    return report["metrics"]["steps"]


def test_exit_code_and_output_pass_through(tmp_path):
    script = write_script(tmp_path / "t.py", steps=10, in_step="pass")
    with open(script, "a") as f:
        f.write("sys.stderr.write('to-stderr\\n')\nsys.exit(3)\n")
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 3
    assert proc.stdout == "trained 10\n"  # -q: whyidle adds nothing to stdout
    assert "to-stderr" in proc.stderr
    assert report["run"]["exit_code"] == 3
    assert any("exited with code 3" in n for n in report["notes"])


def test_stdin_passes_through(tmp_path):
    proc = subprocess.run(whyidle_cmd("run", "-q", "--out", str(tmp_path / "r"), "--", sys.executable, "-c",
                                      "print(input().upper())"), input="hello\n", capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0
    assert proc.stdout == "HELLO\n"


def test_report_printed_to_stderr_with_verdict(tmp_path):
    script = write_script(tmp_path / "t.py", steps=30)
    proc = run_whyidle(["run", "--out", str(tmp_path / "r"), "--", sys.executable, script])
    assert proc.returncode == 0
    assert proc.stdout == "trained 30\n"
    assert "Verdict:" in proc.stderr
    assert "Traceback" not in proc.stderr
    with open(tmp_path / "r" / "report.json") as f:
        assert json.load(f)["schema"] == "whyidle.report/1"


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """A test that fails while its run goes on (steps=10**9) must not leave the run burning CPU
    under the tests after it: kill what this test started and is still alive."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    for p in psutil.Process().children(recursive=True):
        if p.pid not in before:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


def _default_sigint() -> None:
    """As a terminal starts a foreground job: SIGINT at its default action. A test runner started
    in the background of a non-interactive shell (``cmd &``) ignores SIGINT, and an ignored signal
    survives exec, so the training script would never see the Ctrl-C that whyidle passes on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_long_run(tmp_path, script, *options):
    run_dir = str(tmp_path / "r")
    proc = subprocess.Popen(whyidle_cmd("run", "--out", run_dir, *options, "--", sys.executable, script),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    return proc, run_dir


def _wait_for_steps(run_dir, n, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name in os.listdir(run_dir) if os.path.isdir(run_dir) else []:
            if name.startswith("proc-"):
                with open(os.path.join(run_dir, name)) as f:
                    if f.read().count('"k":"step"') >= n:
                        return int(name[5:-6])
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} steps recorded in {timeout} s")


def test_sigint_reaches_child_and_report_still_printed(tmp_path):
    script = write_script(tmp_path / "t.py", steps=10**9, in_step="time.sleep(0.01)")
    proc, run_dir = _start_long_run(tmp_path, script)
    _wait_for_steps(run_dir, 20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    # Python ends an uncaught KeyboardInterrupt by re-raising SIGINT; whyidle ends the same way.
    assert proc.returncode == -signal.SIGINT
    assert "KeyboardInterrupt" in err  # the child's own traceback, passed through
    assert "Verdict:" in err
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    assert report["run"]["interrupted"] is True
    assert report["run"]["signal"] == signal.SIGINT
    assert _steps(report) >= 20


def test_crashing_script_still_reports_steps_before_the_crash(tmp_path):
    script = write_script(tmp_path / "t.py", steps=60, in_step="if step == 25: raise RuntimeError('boom')")
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 1
    assert "RuntimeError: boom" in proc.stderr
    assert _steps(report) == 25  # each optimizer step ends a step; the crash came after the 25th
    assert any("exited with code 1" in n for n in report["notes"])


def test_kill_9_of_child(tmp_path):
    script = write_script(tmp_path / "t.py", steps=10**9, in_step="time.sleep(0.01)")
    proc, run_dir = _start_long_run(tmp_path, script)
    pid = _wait_for_steps(run_dir, 20)
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    assert report["run"]["signal"] == signal.SIGKILL
    assert _steps(report) >= 15


def test_kill_9_of_whyidle_leaves_readable_run(tmp_path):
    script = write_script(tmp_path / "t.py", steps=150, in_step="time.sleep(0.01)")
    proc, run_dir = _start_long_run(tmp_path, script)
    child = _wait_for_steps(run_dir, 10)
    proc.kill()
    proc.communicate(timeout=30)
    # The trainer keeps going; its agent records on until it notices whyidle is gone (within
    # agent.READER_CHECK_S, tests/test_faults.py), so the steps after the kill may or may not be there.
    deadline = time.time() + 60
    while time.time() < deadline:  # ended: gone, or a zombie nobody reaps (a container without an init)
        try:
            if psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    rep = run_whyidle(["report", run_dir, "--json", str(tmp_path / "after.json")])
    assert rep.returncode == 0, rep.stderr
    with open(tmp_path / "after.json") as f:
        report = json.load(f)
    assert _steps(report) >= 10
    assert any("did not finish cleanly" in n for n in report["notes"])


def test_truncated_last_record_is_accepted(tmp_path):
    script = write_script(tmp_path / "t.py", steps=30)
    proc, report, run_dir = observe(tmp_path, [sys.executable, script])
    proc_file = next(n for n in os.listdir(run_dir) if n.startswith("proc-"))
    with open(os.path.join(run_dir, proc_file), "a") as f:
        f.write('{"k":"step","i":99,"t0":1')  # a write cut by a kill
    rep = run_whyidle(["report", run_dir, "--json", "-"])
    assert rep.returncode == 0, rep.stderr
    again = json.loads(rep.stdout)
    assert again["metrics"]["steps"] == report["metrics"]["steps"]
    assert any("truncated" in n for n in again["notes"])


def test_python_dash_m_and_shell_script_are_instrumented(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write_script(pkg / "train.py", steps=20)
    proc, report, _ = observe(tmp_path, [sys.executable, "-m", "pkg.train"], name="m", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert report["framework"] == "torch" and _steps(report) == 20

    sh = tmp_path / "train.sh"
    sh.write_text(f"#!/bin/sh\necho from-shell\n{sys.executable} -m pkg.train\n")
    sh.chmod(sh.stat().st_mode | stat.S_IEXEC)
    proc, report, _ = observe(tmp_path, [str(sh)], name="sh", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "from-shell\ntrained 20\n"
    assert _steps(report) == 20


def test_existing_sitecustomize_still_runs(tmp_path):
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    script = write_script(tmp_path / "t.py", steps=15,
                          pre="print('custom', os.environ.get('USER_SITECUSTOMIZE_RAN'))")
    env = dict(os.environ, PYTHONPATH=str(custom))
    proc, report, _ = observe(tmp_path, [sys.executable, script], env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "custom yes"
    assert _steps(report) == 15


def test_non_python_command_runs_with_host_samples_only(tmp_path):
    proc, report, run_dir = observe(tmp_path, ["sh", "-c", "echo hi; sleep 0.6"])
    assert proc.returncode == 0
    assert proc.stdout == "hi\n"
    assert report["framework"] == "none"
    assert report["verdict"] == "unknown"
    assert finding(report, "no_steps") is not None
    assert "No step data was seen" in finding(report, "no_steps")["summary"]
    assert report["metrics"]["gpu"] is None
    with open(os.path.join(run_dir, "host.jsonl")) as f:
        assert sum(1 for line in f if '"k":"host"' in line) >= 2


@pytest.mark.parametrize("args, code, text", [
    (["run"], 2, "no command given"),
    (["run", "--"], 2, "no command given"),
    (["run", "--", "definitely-not-a-command-xyz"], 127, "command not found: definitely-not-a-command-xyz"),
])
def test_run_bad_input(tmp_path, args, code, text):
    proc = run_whyidle(args, cwd=str(tmp_path))
    assert proc.returncode == code
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unwritable_run_dir_fails_before_the_child_starts(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    marker = tmp_path / "started"
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user that can write anywhere (root)")
        proc = run_whyidle(["run", "--out", str(locked / "run"), "--", "touch", str(marker)])
    finally:
        locked.chmod(0o700)
    assert proc.returncode == 2
    assert "run directory not writable" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_run_dir_that_is_a_file_fails_cleanly(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    marker = tmp_path / "started"
    proc = run_whyidle(["run", "--out", str(blocker / "run"), "--", "touch", str(marker)])
    assert proc.returncode == 2
    assert "run directory not writable" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("setup, text", [
    (lambda p: None, "no such run directory"),
    (lambda p: p.mkdir(), "not a whyidle run directory"),
    (lambda p: (p.mkdir(), (p / "meta.json").write_text("{not json")), "meta.json: not valid JSON"),
    (lambda p: (p.mkdir(), (p / "meta.json").write_text('{"format": "whyidle.run/1"}'),
                (p / "host.jsonl").write_text('{"k":"host"}\ngarbage\n\x00\x00\n')), "host.jsonl: line 2 and 1 more of 3 lines"),
])
def test_report_bad_input(tmp_path, setup, text):
    target = tmp_path / "run"
    setup(target)
    proc = run_whyidle(["report", str(target)])
    assert proc.returncode == 2
    assert text in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_unwritable_json_path_fails_before_the_child_starts(tmp_path):
    marker = tmp_path / "started"
    proc = run_whyidle(["run", "--json", str(tmp_path / "missing" / "r.json"), "--out", str(tmp_path / "r"),
                        "--", "touch", str(marker)])
    assert proc.returncode == 2
    assert "--json" in proc.stderr and "no such directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_report_json_to_a_missing_directory_is_one_line(tmp_path):
    script = write_script(tmp_path / "t.py", steps=10)
    proc, _report, run_dir = observe(tmp_path, [sys.executable, script])
    rep = run_whyidle(["report", run_dir, "--json", str(tmp_path / "nope" / "x.json")])
    assert rep.returncode == 2
    assert len(rep.stderr.strip().splitlines()) == 1 and "no such directory" in rep.stderr


def test_sigint_reaches_python_behind_a_shell_script(tmp_path):
    script = write_script(tmp_path / "t.py", steps=10**9, in_step="time.sleep(0.01)")
    sh = tmp_path / "train.sh"
    sh.write_text(f"#!/bin/sh\n{sys.executable} {script}\necho after-python\n")
    sh.chmod(sh.stat().st_mode | stat.S_IEXEC)
    run_dir = str(tmp_path / "r")
    proc = subprocess.Popen(whyidle_cmd("run", "--out", run_dir, "--", str(sh)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    _wait_for_steps(run_dir, 20)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err  # python itself got the SIGINT, as under a terminal
    assert proc.returncode != 0
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    assert report["run"]["interrupted"] is True and _steps(report) >= 20


def test_json_dash_prints_the_report_after_the_command(tmp_path):
    script = write_script(tmp_path / "t.py", steps=12)
    proc = run_whyidle(["run", "-q", "--out", str(tmp_path / "r"), "--json", "-", "--", sys.executable, script],
                       cwd=str(tmp_path))
    assert proc.returncode == 0
    first, rest = proc.stdout.split("\n", 1)
    assert first == "trained 12"  # the command's output first, untouched
    assert json.loads(rest)["schema"] == "whyidle.report/1"
    assert not (tmp_path / "-").exists()


def test_a_launcher_that_changes_directory_is_still_instrumented(tmp_path):
    # `cd src && python train.py` with a relative run directory: the bootstrap path must be absolute
    src = tmp_path / "src"
    src.mkdir()
    write_script(src / "train.py", steps=15)
    proc = run_whyidle(["run", "-q", "--out", "runs/rel", "--json", "r.json", "--",
                        "sh", "-c", f"cd src && {sys.executable} train.py"], cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["framework"] == "torch" and _steps(report) == 15
