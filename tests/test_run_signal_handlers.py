"""`whyidle run` never harms a program that touches signal handlers (issue 12).

Lightning saves every signal handler when ``fit`` starts and restores them all when it ends;
other programs reset everything to ``SIG_DFL`` or handle ``SIGURG`` themselves. Each runs to
completion under whyidle with the same output and exit code, and the stack sampler keeps
sampling (re-installed, or from a thread). A command ended by any signal, real-time ones
included, ends whyidle the same way (128 + N in the shell), never with a traceback.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import observe, whyidle_cmd

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the per-thread timer signal is Linux-only"), pytest.mark.slow]

#: A training loop paced at ~10 ms a step; ``{before}``, ``{at}`` (run once at step ``{when}``)
#: and ``{after}`` are filled in per test. Only deterministic lines go to stdout.
PROGRAM = """
import os, signal, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
{before}
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
for step in range({steps}):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.01)
    if step == {when}:
{at}
{after}
print("trained", {steps}, "loss", round(loss.item(), 4))
"""


def _program(path, steps=200, when=60, before="", at="pass", after="") -> str:
    code = PROGRAM.format(steps=steps, when=when, before=textwrap.dedent(before),
                          at=textwrap.indent(textwrap.dedent(at), " " * 8), after=textwrap.dedent(after))
    path.write_text(code)
    return str(path)


def _records(run_dir, kind):
    out = []
    for name in glob.glob(os.path.join(run_dir, "proc-*.jsonl")):
        with open(name) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("k") == kind:
                    out.append(rec)
    return sorted(out, key=lambda r: r["t"])


def _plain(script, **kwargs):
    return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=180, **kwargs)


def _mark_time(path):
    """Program lines that write ``time.monotonic_ns()`` (the records' clock) to ``path``."""
    return f"open({str(path)!r}, 'w').write(str(time.monotonic_ns()))"


def test_lightning_style_save_and_restore_of_all_handlers(tmp_path):
    """Handlers saved before training, restored mid-training: SIGURG goes back to SIG_DFL. The
    program lives, the handler is re-installed at the next step and the lost ticks are counted."""
    mark = tmp_path / "restored"
    script = _program(tmp_path / "t.py", before="""
        saved = {s: signal.getsignal(s) for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}}
        """, at=f"""
        for s, h in saved.items():
            if h is not None:
                signal.signal(s, h)
        {_mark_time(mark)}
        time.sleep(0.6)  # the flusher notices; ticks meanwhile are lost, not fatal
        """)
    plain = _plain(script)
    proc, report, run_dir = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout
    assert "Traceback" not in proc.stderr
    restored = int(mark.read_text())
    stacks = [r for r in _records(run_dir, "stacks") if not r.get("startup")]  # the training thread's sampler
    assert all(r["mode"] == "signal" for r in stacks)
    late = [r for r in stacks if r["t"] > restored + 1_000_000_000]
    assert late and sum(r["n"] for r in late) >= 20  # re-installed: samples keep coming
    lost = sum(r["lost"] for r in stacks)
    assert 20 <= lost <= 200, stacks
    assert not _records(run_dir, "notice")


def test_every_handler_set_to_default_mid_training(tmp_path):
    script = _program(tmp_path / "t.py", at="""
        for s in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        time.sleep(0.3)
        """, after="sys.stdout.flush(); sys.exit(5)")
    plain = _plain(script)
    proc, report, run_dir = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == plain.returncode == 5, proc.stderr
    assert proc.stdout == plain.stdout
    assert report["run"]["exit_code"] == 5
    stacks = _records(run_dir, "stacks")
    assert sum(r["lost"] for r in stacks) > 0
    assert sum(r["n"] for r in stacks[-3:]) > 0  # sampling again after the re-install


OWN_HANDLER = """
calls = []
def mine(signum, frame):
    calls.append(time.monotonic())
"""


@pytest.mark.parametrize("when", ["before", "mid"])
def test_programs_own_sigurg_handler_is_never_replaced(tmp_path, when):
    install = "signal.signal(signal.SIGURG, mine)"
    check = """
        assert signal.getsignal(signal.SIGURG) is mine, signal.getsignal(signal.SIGURG)
        late = [c for c in calls if c > time.monotonic() - 0.8]
        sys.stderr.write(f"own handler calls: {len(calls)}, in the last 0.8 s: {len(late)}\\n")
        assert len(late) <= 1, late  # whyidle's timer is gone
        os.kill(os.getpid(), signal.SIGURG)  # the program's own use still reaches its handler
        assert calls and signal.getsignal(signal.SIGURG) is mine
        """
    if when == "before":
        script = _program(tmp_path / "t.py", before=OWN_HANDLER + install, after=check)
    else:
        script = _program(tmp_path / "t.py", before=OWN_HANDLER, at=install, after=check)
    proc, report, run_dir = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("trained 200 loss "), proc.stdout  # the program's own checks passed
    said = [line for line in proc.stderr.splitlines() if "handles SIGURG itself" in line]
    assert len(said) == 1 and said[0].startswith("[whyidle] ")
    notices = [r for r in _records(run_dir, "notice") if "SIGURG" in r["msg"]]
    assert len(notices) == 1
    stacks = [r for r in _records(run_dir, "stacks") if not r.get("startup")]  # the training thread's sampler
    assert stacks[-1]["mode"] == "thread"
    assert sum(r["n"] for r in stacks if r["mode"] == "thread") >= 20
    if when == "before":
        assert all(r["mode"] == "thread" for r in stacks)
        assert "own handler calls: 0," in proc.stderr  # no tick of whyidle's ever reached it


def test_child_killed_by_a_real_time_signal(tmp_path):
    rt = int(signal.SIGRTMIN) + 5
    script = _program(tmp_path / "t.py", steps=40, when=20, at=f"os.kill(os.getpid(), {rt})")
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == -rt  # re-raised on whyidle itself, as for SIGINT
    assert "Traceback" not in proc.stderr
    assert report["run"]["signal"] == rt
    shell = subprocess.run(["sh", "-c", " ".join(whyidle_cmd("run", "-q", "--no-html", "--out", str(tmp_path / "s"),
                                                             "--", sys.executable, script)) + "; echo rc=$?"],
                           capture_output=True, text=True, timeout=180)
    assert shell.stdout.strip().endswith(f"rc={128 + rt}")
    assert "Traceback" not in shell.stderr


def test_sigurg_sent_to_the_child_does_not_kill_it(tmp_path):
    script = _program(tmp_path / "t.py", steps=40, when=20, at="""
        os.kill(os.getpid(), signal.SIGURG)
        signal.raise_signal(signal.SIGURG)
        """)
    plain = _plain(script)
    proc, report, _ = observe(tmp_path, [sys.executable, script])
    assert proc.returncode == plain.returncode == 0, proc.stderr
    assert proc.stdout == plain.stdout
    assert report["run"]["signal"] is None


KERAS_PROGRAM = """
import os, signal, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras

class Reset(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:  # what a library restoring the handlers it saved before fit does
            signal.signal(signal.SIGURG, signal.SIG_DFL)
            open({mark!r}, "w").write(str(time.monotonic_ns()))
            time.sleep(1.0)  # its ticks are ignored: the program lives

rng = np.random.default_rng(0)
x, y = rng.random((2048, 16), dtype="float32"), rng.integers(0, 4, 2048)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[Reset()])
print("fitted")
"""


def test_keras_fit_with_the_handler_reset_between_epochs(tmp_path):
    """The Keras instrumentation re-installs the handler at the next batch."""
    pytest.importorskip("keras")
    pytest.importorskip("tensorflow")
    mark = tmp_path / "reset"
    script = tmp_path / "k.py"
    script.write_text(KERAS_PROGRAM.format(mark=str(mark)))
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    proc, report, run_dir = observe(tmp_path, [sys.executable, str(script)], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "fitted\n"
    reset = int(mark.read_text())
    stacks = [r for r in _records(run_dir, "stacks") if not r.get("startup")]  # the training thread's sampler
    assert all(r["mode"] == "signal" for r in stacks)
    assert sum(r["lost"] for r in stacks) >= 30
    # records drained after the sleep hold only samples taken after the reset: re-installed
    assert sum(r["n"] for r in stacks if r["t"] > reset + 900_000_000) >= 5
