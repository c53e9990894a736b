"""Records the golden run directories in ``tests/data/runs/`` (checked in, read by
``tests/test_golden_runs.py`` in-process, the way Holistic Trace Analysis keeps real traces in
``tests/data``).

Each is a real ``whyidle run --no-html`` of a scenario in ``tests/scenarios`` on a quiet machine;
only the recorded files are kept (``meta.json``, ``host.jsonl``, ``gpu.jsonl``, ``proc-*.jsonl``),
never the rendered report, so the test re-derives everything from the records. Paths in the
records (run directory, working directory) are the ones of the recording machine.

    python tests/data/record_runs.py [NAME ...]      # all when no name is given

Re-record when the run-directory format changes (``docs/run-format.md``); the expectations in
``tests/test_golden_runs.py`` then say whether the diagnosis still holds.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCENARIOS = os.path.join(REPO, "tests", "scenarios")

#: name → scenario arguments (``tests/scenarios/<script>``, run with this interpreter).
RUNS = {
    "image_decode_main": ["image_decode_main.py", "--steps", "30"],
    "python_loop_loss": ["c12_python_loop_loss.py", "--steps", "60"],
    "batch1": ["batch1.py", "--steps", "150"],
    "compute_heavy": ["compute_heavy.py", "--steps", "40"],
    "keras_sequential_map": ["c03_tfdata_sequential_map.py", "--steps", "40"],
}
KEEP = ("meta.json", "host.jsonl", "gpu.jsonl", "proc-*.jsonl")


def record(name: str) -> str:
    """Runs one scenario under ``whyidle run`` and copies its records to ``runs/<name>``."""
    script, *args = RUNS[name]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, name)
        cmd = [sys.executable, "-m", "whyidle", "run", "-q", "--no-html", "--out", run_dir, "--",
               sys.executable, os.path.join(SCENARIOS, script), *args]
        subprocess.run(cmd, check=True, cwd=SCENARIOS)
        dest = os.path.join(HERE, "runs", name)
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        for pattern in KEEP:
            for path in glob.glob(os.path.join(run_dir, pattern)):
                shutil.copy(path, dest)
    return dest


if __name__ == "__main__":
    for n in sys.argv[1:] or RUNS:
        print(record(n))
