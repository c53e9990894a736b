"""The live status: a pinned bottom line on a terminal, plain periodic lines elsewhere."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import time

import pytest

from conftest import whyidle_cmd, write_script

pytestmark = pytest.mark.slow


def test_pinned_status_line_on_a_terminal(tmp_path):
    script = write_script(tmp_path / "t.py", steps=150, in_step="time.sleep(0.02)")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(whyidle_cmd("run", "--out", str(tmp_path / "r"), "--", sys.executable, script),
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0
    assert "trained 150" in out  # the command's own output reaches the terminal
    assert "\x1b[1;23r" in out  # rows 1-23 scroll; row 24 holds the status
    assert "\x1b[24;1H" in out and "steps/s" in out
    assert "\x1b[r" in out  # full height restored at the end
    assert out.index("\x1b[r") < out.index("Verdict:")


def test_plain_status_lines_when_not_a_terminal(tmp_path):
    script = write_script(tmp_path / "t.py", steps=400, in_step="time.sleep(0.02)")
    proc = subprocess.run(whyidle_cmd("run", "--out", str(tmp_path / "r"), "--", sys.executable, script),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    lines = [l for l in proc.stderr.splitlines() if l.startswith("[whyidle]") and "steps/s" in l]
    assert lines, proc.stderr
    assert "\x1b[" not in proc.stderr.split("whyidle report")[0]
    assert "data wait" in lines[-1]


def test_quiet_prints_nothing(tmp_path):
    script = write_script(tmp_path / "t.py", steps=20)
    proc = subprocess.run(whyidle_cmd("run", "-q", "--out", str(tmp_path / "r"), "--", sys.executable, script),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert proc.stdout == "trained 20\n"
    assert proc.stderr == ""


def test_keras_steps_show_input_wait_once_the_window_is_read(tmp_path):
    import json

    from whyidle.record.tail import StepTail

    path = tmp_path / "proc-7.jsonl"
    steps = [{"k": "step", "i": i, "t0": i * 100, "t1": i * 100 + 100, "by": "keras", "fn": 80} for i in range(5)]
    path.write_text("".join(json.dumps(s, separators=(",", ":")) + "\n" for s in steps))
    tail = StepTail(str(tmp_path))
    tail.poll()
    total, rate, wait = tail.summary(500)
    assert total == 5 and wait is None  # not measured yet: never shown as 0 %
    with open(path, "a") as f:
        f.write(json.dumps({"k": "tf_window", "calls": [[80, 60], [80, 20]]}, separators=(",", ":")) + "\n")
    tail.poll()
    total, rate, wait = tail.summary(500)
    assert total == 5 and wait == pytest.approx(5 * 80 * 0.5 / 500)


def test_steps_without_detail_count_and_the_wait_comes_from_timed_steps(tmp_path):
    """Short steps are recorded in full on one step in k (``steps`` rows for the others): the live
    count and rate include every step, the data-wait share only the steps whose wait was timed."""
    import json

    from whyidle.record.steptable import LITE_COLUMNS
    from whyidle.record.tail import StepTail

    rows = [dict.fromkeys(LITE_COLUMNS) | {"i": i, "t0": i * 100, "t1": i * 100 + 100, "by": 0, "boundary": 0}
            for i in range(9)]
    recs = [{"k": "steps", "rows": [[r[c] for c in LITE_COLUMNS] for r in rows]},
            {"k": "step", "i": 9, "t0": 900, "t1": 1000, "by": "optimizer", "data": 40}]
    (tmp_path / "proc-7.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
    tail = StepTail(str(tmp_path))
    tail.poll()
    total, rate, wait = tail.summary(1000)
    assert total == 10
    assert rate == pytest.approx(10 / 1000e-9)
    assert wait == pytest.approx(0.4)
