"""The Keras / TensorFlow instrumentation inside real (tiny) Keras programs under `whyidle run`:
the profiler window, stepping aside for the program's own profiler, steps_per_execution, custom
loops, and that nothing of TensorFlow is imported when the program does not import it."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import SCENARIOS, needs, observe
from whyidle.record.steptable import PHASE_CODES

pytestmark = [pytest.mark.slow, needs("tensorflow")]

PRELUDE = """\
import sys, time
import numpy as np
import tensorflow as tf
import keras

def model():
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=SPE)
    return m

def slow(i):
    time.sleep(0.004)
    return np.full((8,), i % 7, np.float32), np.int64(i % 2)

def load(i):
    x, y = tf.numpy_function(slow, [i], [tf.float32, tf.int64])
    x.set_shape((8,)); y.set_shape(())
    return x, y

ds = tf.data.Dataset.range(100000).map(load).batch(4)
"""


def run_keras(tmp_path, body, name, spe=1, timeout=240, prelude=None):
    """Runs ``prelude`` (default: the TensorFlow-backend PRELUDE with ``spe``) + ``body`` under
    whyidle; returns (proc, report, records)."""
    script = tmp_path / f"{name}.py"
    script.write_text((prelude or PRELUDE.replace("SPE", str(spe))) + textwrap.dedent(body))
    proc, report, run_dir = observe(tmp_path, [sys.executable, str(script)], name=name, timeout=timeout,
                                    cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None, proc.stderr[-3000:]
    records = []
    for path in glob.glob(os.path.join(run_dir, "proc-*.jsonl")):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return proc, report, records


def kinds(records, k):
    return [r for r in records if r.get("k") == k]


def test_window_measures_input_wait_with_steps_per_execution(tmp_path):
    proc, report, records = run_keras(tmp_path, "model().fit(ds, steps_per_epoch=30, epochs=2, verbose=0)\n",
                                      "spe", spe=2)
    steps = [s for s in kinds(records, "step") if s["by"] == "keras"]
    assert len(steps) == 30 and all(s["batches"] == 2 and s["samples"] == 8 for s in steps)
    window = kinds(records, "tf_window")
    assert len(window) == 1 and "error" not in window[0]
    # every call runs 2 batches of 4 elements × 4 ms of sequential loading: ≥ 32 ms of GetNext per call
    assert len(window[0]["calls"]) >= 3
    assert all(get_next >= 0.8 * 32e6 and get_next <= dur for dur, get_next in window[0]["calls"])
    assert report["framework"] == "keras" and report["keras"]["input_wait"]["method"] == "tf_profiler"
    assert report["metrics"]["shares"]["data_wait"] > 0.6
    assert report["verdict"] == "input_bound"
    # phase spans: each step is in the train function from near its start, then back to other
    compute, other = PHASE_CODES.index("compute"), PHASE_CODES.index("other")
    assert all(s["ph"][0::2][:2] == [compute, other] and s["ph"][1] <= s["ph"][3] for s in steps)
    # Keras's epoch-end logs (what History holds) become logged metrics
    assert report["logged_metrics"]["loss"]["count"] == 2 and report["logged_metrics"]["loss"]["source"] == "keras"
    assert report["logged_metrics"]["loss"]["epoch"] == 1


def test_tensorboard_profiling_makes_the_window_step_aside(tmp_path):
    body = """\
    tb = keras.callbacks.TensorBoard(log_dir="tb", profile_batch=(3, 5))
    model().fit(ds, steps_per_epoch=20, epochs=1, verbose=0, callbacks=[tb])
    """
    proc, report, records = run_keras(tmp_path, body, "tb")
    assert not kinds(records, "tf_window")
    assert any("steps aside" in n["msg"] for n in kinds(records, "notice"))
    assert glob.glob(str(tmp_path / "tb" / "**" / "*.xplane.pb"), recursive=True)  # the user's profile is there
    assert report["keras"]["input_wait"]["method"] is None
    assert not glob.glob(os.path.join(str(tmp_path), "tb", "*", "tfprof-*"))


def test_program_starting_the_profiler_during_the_window_wins(tmp_path):
    body = """\
    class Prof(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 5:
                tf.profiler.experimental.start("mine")
            if batch == 8:
                tf.profiler.experimental.stop()
    model().fit(ds, steps_per_epoch=20, epochs=1, verbose=0, callbacks=[Prof()])
    print("RESULT ok")
    """
    proc, report, records = run_keras(tmp_path, body, "mine")
    assert "RESULT ok" in proc.stdout
    assert glob.glob(str(tmp_path / "mine" / "**" / "*.xplane.pb"), recursive=True)
    assert not kinds(records, "tf_window")
    assert any("tf.profiler.experimental.start" in n["msg"] for n in kinds(records, "notice"))


def test_custom_loop_steps_from_the_iterator(tmp_path):
    body = """\
    m = model()
    opt = keras.optimizers.SGD()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, m(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
        return loss

    for i, (x, y) in enumerate(ds):
        train_step(x, y)
        if i == 30:
            break
    """
    proc, report, records = run_keras(tmp_path, body, "loop")
    steps = kinds(records, "step")
    assert len(steps) >= 30 and all(s["by"] == "iterator" for s in steps)
    assert all(s["samples"] == 4 for s in steps)
    later = steps[3:]
    # 4 elements × 4 ms of sequential loading per batch; tf.data loads the next batch in the
    # background (map_and_batch_fusion) while the tiny step runs, so the wait is a little less
    waits = sorted(s["data"] for s in later)
    assert waits[len(waits) // 2] >= 0.5 * 16e6, waits
    assert all(s["comp"] > 0 for s in later)
    data = PHASE_CODES.index("data")
    assert all(s["ph"][:2] == [data, 0] for s in later)  # a step starts in next()
    assert report["framework"] == "tensorflow"  # a Keras model, but the loop is the program's own
    pipeline = report["keras"]["pipeline"]  # described at the loop's 3rd next()
    assert [st["op"] for st in pipeline] == ["range", "map", "batch"]
    assert report["findings"][0]["evidence"]["cause"] == "sequential_map"
    assert report["keras"]["input_wait"]["method"] == "iterator"
    assert any(n.startswith("Custom TensorFlow loop: a step runs from one eager next()") for n in report["notes"])
    assert report["verdict"] == "input_bound"


def test_tensorflow_is_never_imported_for_the_program(tmp_path):
    code = "import sys; print('TF', 'tensorflow' in sys.modules, 'keras' in sys.modules)"
    proc, report, _ = observe(tmp_path, [sys.executable, "-c", code], name="plain")
    assert proc.returncode == 0
    assert "TF False False" in proc.stdout


def test_a_keras_without_the_hooks_gives_one_notice_and_a_report(tmp_path):
    # a "keras" whose Model has no fit/evaluate/predict (an unknown or broken version)
    pkg = tmp_path / "fakekeras" / "keras"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '9.0'\nclass Model:\n    pass\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fakekeras"))
    code = "import keras, time; t = time.time()\nwhile time.time() - t < 0.5: pass\nprint('trained')"
    proc, report, run_dir = observe(tmp_path, [sys.executable, "-c", code], name="fake", env=env)
    assert proc.returncode == 0 and "trained" in proc.stdout
    assert report is not None and report["verdict"] == "unknown"
    notices = [n for n in report["notes"] if "Keras instrumentation disabled" in n]
    assert len(notices) == 1, report["notes"]
    assert proc.stderr.count("[whyidle] Keras instrumentation disabled") == 1


def test_an_error_in_a_hook_turns_the_instrumentation_off_once():
    from whyidle.instrument.keras import KerasInstrument, _safe

    class Agent:
        def __init__(self):
            self.notices, self.records = [], []

        def notice(self, msg):
            self.notices.append(msg)

        def record(self, rec):
            self.records.append(rec)

    agent = Agent()
    inst = KerasInstrument(agent)
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("boom")

    _safe(inst, broken)
    _safe(inst, broken)  # off now: not run again
    assert inst.off and calls == [1]
    assert len(agent.notices) == 1 and "RuntimeError('boom')" in agent.notices[0]


#: The RESULT line of tests/scenarios/c03_tfdata_sequential_map.py (its numbers differ run to run).
_RESULT = re.compile(r"^RESULT samples_per_s=[0-9.]+ step_s=[0-9.]+$", re.M)


def test_c03_output_and_exit_code_pass_through(tmp_path):
    script = os.path.join(SCENARIOS, "c03_tfdata_sequential_map.py")
    plain = subprocess.run([sys.executable, script, "--steps", "15"], capture_output=True, text=True, timeout=180)
    assert plain.returncode == 0, plain.stderr[-3000:]
    proc, report, _ = observe(tmp_path, [sys.executable, script, "--steps", "15"], name="c03-short")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None
    # the program's stdout is unchanged: the same lines, the RESULT line once (its numbers differ run to run)
    strip = lambda out: [_RESULT.sub("RESULT", line) for line in out.splitlines()]  # noqa: E731
    assert strip(proc.stdout) == strip(plain.stdout), (proc.stdout[-2000:], plain.stdout[-2000:])
    assert len(_RESULT.findall(proc.stdout)) == 1

    # a failing program keeps its exit code and its error message (argparse after TensorFlow's
    # import: exit 2, the usage and the error on stderr, nothing on stdout)
    proc, _, _ = observe(tmp_path, [sys.executable, script, "--variant", "bogus"], name="c03-bad")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "usage: " in proc.stderr and "invalid choice: 'bogus'" in proc.stderr
    assert proc.stdout == ""


# -- the torch and JAX backends ------------------------------------------------------------------

BACKEND_PRELUDE = """\
import os, sys, time
BACKEND = os.environ["KERAS_BACKEND"] = "@BACKEND@"
import numpy as np
import keras

SLEEP = 0.012  # per batch: the input's own wait, a floor for the measured data wait

class Batches(keras.utils.PyDataset):
    def __init__(self, n, **kwargs):
        super().__init__(**kwargs)
        self.n = n
    def __len__(self):
        return self.n
    def __getitem__(self, i):
        time.sleep(SLEEP)
        return np.full((4, 8), i % 7, np.float32), np.arange(4) % 2

def gen():
    while True:
        time.sleep(SLEEP)
        yield np.ones((4, 8), np.float32), np.arange(4) % 2

m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
"""


def run_backend(tmp_path, backend, body, name):
    return run_keras(tmp_path, body, name, prelude=BACKEND_PRELUDE.replace("@BACKEND@", backend))


def steps_of_fit(records, call):
    """The Keras steps inside one fit's keras_call window."""
    return [s for s in kinds(records, "step") if s["by"] == "keras" and call["t0"] <= s["t0"] <= call["t1"]]


@pytest.mark.timing  # measured shares: 0.77-0.96 alone, 0.25 in a CI run whose 3 test processes shared 2 cores
@pytest.mark.parametrize("backend", ["torch", pytest.param("jax", marks=needs("jax"))])
def test_each_batch_fit_takes_is_timed_on_the_torch_and_jax_backends(tmp_path, backend):
    """PyDataset (with validation data), a Python generator and, on torch, a torch DataLoader:
    every training step carries the batch's wait (at least the input's own sleep), apart from the
    train function; validation batches are not training input; nothing of whyidle stays on the
    model; on torch the PyTorch instrumentation stood aside (no DataLoader or steps of its own)."""
    body = """
    m.fit(Batches(8), validation_data=Batches(3), epochs=2, verbose=0)
    print("WRAPPED", getattr(m.train_function, "_whyidle", False))
    m.fit(gen(), steps_per_epoch=6, epochs=1, verbose=0)
    if BACKEND == "torch":
        import torch
        from torch.utils.data import DataLoader, Dataset
        class Rows(Dataset):
            def __len__(self):
                return 24
            def __getitem__(self, i):
                time.sleep(SLEEP / 4)
                return np.ones(8, np.float32), i % 2
        m.fit(DataLoader(Rows(), batch_size=4), epochs=1, verbose=0)
    m.evaluate(Batches(3), verbose=0)
    print("DONE")
    """
    proc, report, records = run_backend(tmp_path, backend, body, f"inputs-{backend}")
    assert "WRAPPED False" in proc.stdout and "DONE" in proc.stdout
    calls = [c for c in kinds(records, "keras_call") if c["fn"] == "fit"]
    assert [c["input"] for c in calls] == ["PyDataset", "generator"] + (["torch DataLoader"] if backend == "torch" else [])
    assert calls[0]["workers"] == 1 and calls[0]["input_class"] == "Batches" and calls[0]["input_kwargs"] is True
    assert calls[0]["site"].endswith(".py:" + str(BACKEND_PRELUDE.count("\n") + 2))
    for call, n in zip(calls, (16, 6, 6)):
        steps = steps_of_fit(records, call)
        assert len(steps) == n, (call["input"], len(steps))
        # the torch loop fetches a step's next batch at its end (the last of an epoch has none); Keras
        # takes a generator's first batches ahead to learn their shapes (they wait for nothing)
        floor = 12e6 if call["input"] != "torch DataLoader" else 4 * 3e6
        fetched = [s for s in steps if s["data"] >= floor * 0.9]
        assert len(fetched) >= n - 3, (call["input"], [s["data"] for s in steps])
        assert all(0 <= s["comp"] <= s["fn"] for s in steps)
        assert all(s["samples"] == 4 for s in fetched), [s["samples"] for s in steps]
    # validation ran as evaluation, its batches no training input (2 epochs x 3 batches of 12 ms)
    evals = [r for r in kinds(records, "region") if r["kind"] == "evaluation" and r["entry"] == "Model.evaluate"]
    assert len(evals) == 3, evals  # two validations inside fit, one evaluate after
    assert not [r for r in kinds(records, "region") if r.get("entry") in ("Module.eval", "exit")
                and r["t1"] - r["t0"] > 0.5e9], kinds(records, "region")
    assert report["keras"]["input_wait"]["method"] == "fit_input"
    assert report["metrics"]["shares"]["data_wait"] > 0.3
    assert {s["by"] for s in kinds(records, "step")} == {"keras"}
    assert not kinds(records, "loader") or backend == "torch" and all(
        r["dataset"] == "Rows" for r in kinds(records, "loader"))  # the program's own DataLoader, built outside fit
    if backend == "jax":  # completions of every training step
        done = {i for r in kinds(records, "keras_done") for i, _ in r["done"]}
        assert {s["i"] for s in kinds(records, "step")} <= done
