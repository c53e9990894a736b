"""On-demand deep traces of Keras on the TensorFlow backend (issue 34,
``src/whyidle/instrument/tf_deep_trace.py``): a request in ``RUN_DIR/control/trace.json`` opens a
TensorFlow profiler window of N train-function calls at ``fit``'s batch begins, whose
``.xplane.pb`` lands in ``RUN_DIR/traces/<id>-<pid>/`` (TensorBoard's layout) with one
``trace_window`` record (``method: "tf_profiler"``, each call's ``[duration_ns, get_next_ns]``);
the program's own profiler always wins; other backends answer with an error record.

The in-process tests drive :class:`KerasDeepTrace` at hand-made batch begins with a stand-in
profiler (no TensorFlow import); the ``slow`` ones run real Keras programs under ``whyidle run``
and write the request themselves once steps are recorded (the parent's side, ``run/rolling.py``,
is not needed for them).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import needs, whyidle_cmd
from whyidle.instrument import tfprof
from whyidle.instrument.tf_deep_trace import DISCARDED, NEEDS_TF, STEPPED_ASIDE, KerasDeepTrace


def request(run_dir, **fields):
    os.makedirs(os.path.join(run_dir, "control"), exist_ok=True)
    req = {"id": "t1", "steps": 3, "ranks": None, "pids": None, "reason": "test", "t": time.monotonic_ns(), **fields}
    path = os.path.join(run_dir, "control", "trace.json")
    with open(path + ".tmp", "w") as f:
        json.dump(req, f)
    os.replace(path + ".tmp", path)


# -- in-process, a stand-in profiler ---------------------------------------------------------------

class _Agent:
    def __init__(self, run_dir):
        self.run_dir = str(run_dir)
        self.t_start = time.monotonic_ns()
        self.records, self.notices, self.collectors, self.on_exit = [], [], [], []

    def record(self, rec):
        self.records.append(rec)

    def notice(self, msg):
        self.notices.append(msg)


class _Window:
    def __init__(self, state):
        self.state = state


class _Inst:
    """What KerasDeepTrace reads of KerasInstrument; ``batch()`` is one training batch: its
    begin (the boundary, as ``on_batch_begin`` calls it), the step's end, the train-function call."""

    def __init__(self, backend="tensorflow", window=None):
        self.backend, self.window = backend, window
        self.calls = self.step_i = self.last_end = 0
        self.tb_profilers = []
        self.deep = None

    def batch(self):
        now = time.monotonic_ns()
        if now >= self.deep.due:
            now = self.deep.boundary(self.calls, self.step_i, now)
        self.step_i += 1
        self.calls += 1
        self.last_end = time.monotonic_ns()
        return now


class _Profiler:
    """Stands in for ``profiler_v2`` (start / stop(save) / a running session)."""

    def __init__(self):
        self.running = None  # the log dir of the session running
        self.started, self.saved = [], []

    def start(self, logdir):
        if self.running is not None:
            raise RuntimeError("Another profiler is running.")
        self.running = logdir
        self.started.append(logdir)

    def stop(self, save=True):
        if save:
            self.saved.append(self.running)
        self.running = None


@pytest.fixture
def setup(tmp_path, monkeypatch):
    prof = _Profiler()
    monkeypatch.setattr(tfprof, "start_profiler", prof.start)
    monkeypatch.setattr(tfprof, "session_running", lambda: prof.running is not None)
    monkeypatch.setattr(tfprof, "_profiler", lambda: prof)

    def make(**kw):
        inst = _Inst(**kw)
        inst.deep = KerasDeepTrace(_Agent(tmp_path), inst)
        return inst

    return make, prof


def windows(inst):
    """The trace_window records so far (those of saved windows read as the flusher thread would)."""
    agent = inst.deep.agent
    for collect in agent.collectors:
        agent.records += collect()
    return [r for r in agent.records if r["k"] == "trace_window"]


def test_a_request_traces_the_next_calls_once(setup, tmp_path):
    make, prof = setup
    inst = make()
    inst.batch()
    assert inst.deep.due > time.monotonic_ns()  # the next look in about a second
    request(tmp_path, steps=3)
    inst.deep.due = 0
    starts = [inst.batch() for _ in range(6)]
    assert prof.started == [str(tmp_path / "traces" / f"t1-{os.getpid()}")] and prof.saved == prof.started
    [rec] = windows(inst)
    # no .xplane.pb from a stand-in: the record says so, with the window's span and calls
    assert rec["error"] == "no .xplane.pb file was written" and rec["file"] is None
    assert rec["method"] == "tf_profiler" and rec["calls"] == [] and rec["logdir"] == f"traces/t1-{os.getpid()}"
    assert rec["steps"] == 3 and rec["first_step"] == 1 and rec["t0"] == starts[0] and rec["t1"] < starts[3]
    inst.deep.due = 0
    inst.batch()  # served already
    assert len(windows(inst)) == 1 and len(prof.started) == 1


def test_the_request_waits_for_whyidles_start_of_fit_window(setup, tmp_path):
    make, prof = setup
    inst = make(window=_Window("waiting"))
    request(tmp_path, steps=2)
    for _ in range(4):
        inst.batch()
    assert not prof.started and inst.deep.state == "pending" and inst.deep.due == 0
    inst.window.state = "active"
    inst.batch()
    assert not prof.started
    inst.window.state = "done"
    inst.batch()
    assert len(prof.started) == 1
    for _ in range(3):
        inst.batch()
    [rec] = windows(inst)
    assert rec["steps"] == 2 and rec["first_step"] == 5


def test_the_programs_running_profiler_makes_whyidle_step_aside(setup, tmp_path):
    make, prof = setup
    inst = make()
    prof.start("mine")
    request(tmp_path)
    for _ in range(3):
        inst.batch()
    [rec] = windows(inst)
    assert rec["error"] == STEPPED_ASIDE and rec["steps"] == 0 and prof.started == ["mine"]
    prof.stop()
    # a TensorBoard callback of this fit whose profile_batch range is still ahead counts as running

    class TensorBoard:
        _global_train_batch, _stop_batch = 2, 5

    inst.tb_profilers = [TensorBoard()]
    request(tmp_path, id="t2")
    inst.deep.due = 0
    inst.batch()
    assert [r["error"] for r in windows(inst)] == [STEPPED_ASIDE, STEPPED_ASIDE]
    TensorBoard._global_train_batch = 5  # its range ended
    request(tmp_path, id="t3")
    inst.deep.due = 0
    inst.batch()
    assert inst.deep.state == "open"


def test_the_program_starting_its_profiler_discards_whyidles_window(setup, tmp_path):
    make, prof = setup
    inst = make()
    request(tmp_path, steps=50)
    inst.deep.due = 0
    inst.batch()
    inst.batch()
    assert inst.deep.state == "open"
    inst.deep.program_starts()  # what the wrapper of profiler_v2.start calls first
    prof.start("mine")
    [rec] = windows(inst)
    assert rec["error"] == DISCARDED and rec["file"] is None and rec["steps"] == 2 and not prof.saved
    assert inst.deep.state == "idle" and inst.deep.due == 0


def test_a_fit_ending_inside_the_window_keeps_it(setup, tmp_path):
    make, prof = setup
    inst = make()
    request(tmp_path, steps=20)
    inst.deep.due = 0
    for _ in range(4):
        inst.batch()
    inst.deep.fit_ended(time.monotonic_ns())
    [rec] = windows(inst)
    assert rec["error"] == "fit ended after 4 of 20 train-function calls" and rec["steps"] == 4
    assert rec["t1"] == inst.last_end and len(prof.saved) == 1


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_answer_each_request_once(setup, tmp_path, backend):
    make, prof = setup
    inst = make(backend=backend)
    request(tmp_path)
    for _ in range(3):
        inst.deep.due = 0
        inst.batch()
    [rec] = windows(inst)
    assert rec["error"] == NEEDS_TF.format(backend=backend) and rec["method"] is None and not prof.started


def test_a_profiler_that_fails_to_start_is_a_record(setup, tmp_path, monkeypatch):
    make, prof = setup
    inst = make()
    prof.start("someone's")  # a session whyidle cannot see (a profiler server's)
    monkeypatch.setattr(tfprof, "session_running", lambda: False)
    request(tmp_path)
    inst.batch()
    [rec] = windows(inst)
    assert rec["error"].startswith("the profiler did not start: RuntimeError") and inst.deep.state == "idle"


# -- real runs -------------------------------------------------------------------------------------

FIT = """\
import os, sys, time, json
MODE, SECONDS = sys.argv[1], float(sys.argv[2])
if MODE == "jax":
    os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
import keras

m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))

# fit ends at an epoch's end once SECONDS passed (or the file `until` exists): stopping mid-epoch,
# then exiting, can leave a tf.numpy_function call of tf.data's in flight at interpreter exit,
# where TensorFlow 2.21 waits for it forever
class Stop(keras.callbacks.Callback):
    def __init__(self, until=None):
        super().__init__()
        self.until = until
    def on_train_begin(self, logs=None):
        self.end = time.monotonic() + SECONDS
    def on_epoch_end(self, epoch, logs=None):
        if (os.path.exists(self.until) if self.until else time.monotonic() > self.end):
            self.model.stop_training = True

if MODE == "jax":
    x, y = np.ones((160, 8), np.float32), np.arange(160) % 2
    m.fit(x, y, batch_size=4, epochs=10**6, verbose=0, callbacks=[Stop()])
    print("RESULT {}", flush=True)
else:
    import tensorflow as tf
    from tensorflow.python.profiler import profiler_v2

    def slow(i):
        time.sleep(0.002)
        return np.full((8,), i % 7, np.float32), np.int64(i % 2)

    def load(i):
        x, y = tf.numpy_function(slow, [i], [tf.float32, tf.int64])
        x.set_shape((8,)); y.set_shape(())
        return x, y

    ds = tf.data.Dataset.range(10**7).map(load).batch(4)

if MODE == "plain":
    m.fit(ds, steps_per_epoch=40, epochs=10**6, verbose=0, callbacks=[Stop()])
    print("RESULT {}", flush=True)
elif MODE == "own":
    # first the program profiles its whole fit (until the test says so), then it starts its own
    # profiler as soon as it sees one running (whyidle's window)
    tf.profiler.experimental.start("mine1")
    m.fit(ds, steps_per_epoch=40, epochs=10**6, verbose=0, callbacks=[Stop(until=sys.argv[3])])
    tf.profiler.experimental.stop()

    class Grab(keras.callbacks.Callback):
        started = stopped = None
        def on_train_batch_begin(self, batch, logs=None):
            if Grab.started is None and profiler_v2._profiler is not None:
                tf.profiler.experimental.start("mine2")
                Grab.started = 0
            elif Grab.started is not None and Grab.stopped is None:
                Grab.started += 1
                if Grab.started == 3:
                    tf.profiler.experimental.stop()
                    Grab.stopped = True

    m.fit(ds, steps_per_epoch=40, epochs=10**6, verbose=0, callbacks=[Grab(), Stop()])
    print("RESULT " + json.dumps({"grabbed": bool(Grab.stopped)}), flush=True)
"""


from test_deep_trace import _records  # noqa: E402 - the same reader of a run's proc records


def _wait_for(cond, timeout=90.0, what="it"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _launch(tmp_path, *args):
    script = tmp_path / "fit.py"
    script.write_text(FIT)
    run_dir = str(tmp_path / "run")
    proc = subprocess.Popen(whyidle_cmd("run", "-q", "--out", run_dir, "--no-html", "--", sys.executable, str(script),
                                        *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(tmp_path))
    return proc, run_dir


def _finish(proc):
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    return json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[len("RESULT "):])


@pytest.mark.slow
@needs("tensorflow")
def test_a_request_during_fit_writes_a_tensorflow_trace(tmp_path):
    proc, run_dir = _launch(tmp_path, "plain", "12")
    try:
        _wait_for(lambda: _records(run_dir, "step"), what="the first Keras steps")
        request(run_dir, id="deep-1", steps=10, reason="a test asked")
        [rec] = _wait_for(lambda: _records(run_dir, "trace_window"), what="the trace_window record")
        request(run_dir, id="deep-2", steps=5, pids=[proc.pid])  # whyidle's own pid: no trainer's
    except BaseException:
        proc.kill()
        raise
    _finish(proc)
    assert [r["id"] for r in _records(run_dir, "trace_window")] == ["deep-1"]
    assert rec["error"] is None and rec["reason"] == "a test asked" and rec["method"] == "tf_profiler"
    assert rec["steps"] == 10 and len(rec["calls"]) == 10 and rec["rank"] is None
    assert all(0 < get_next <= dur for dur, get_next in rec["calls"])  # the input wait inside each call
    assert rec["fn_name"] and rec["iterators"]
    pid = int(rec["_file"][len("proc-"):-len(".jsonl")])
    assert rec["logdir"] == f"traces/deep-1-{pid}"
    assert rec["file"].startswith(f"traces/deep-1-{pid}/plugins/profile/") and rec["file"].endswith(".xplane.pb")
    assert os.path.getsize(os.path.join(run_dir, rec["file"])) > 0
    assert oct(os.stat(os.path.join(run_dir, rec["file"])).st_mode & 0o777) == oct(0o600)
    # the window's span is its steps' own: from the first traced step's start to the last's end
    steps = {s["i"]: s for s in _records(run_dir, "step") if s["_file"] == rec["_file"]}
    first, last = rec["first_step"], rec["first_step"] + rec["steps"] - 1
    assert steps[first]["t0"] == rec["t0"] and steps[last]["t1"] == rec["t1"]
    assert rec["stop_s"] > 0 and rec["export_s"] == 0.0


@pytest.mark.slow
@needs("tensorflow")
def test_the_programs_own_profiler_wins(tmp_path):
    marker = str(tmp_path / "phase2")
    proc, run_dir = _launch(tmp_path, "own", "8", marker)
    try:
        _wait_for(lambda: _records(run_dir, "step"), what="the first Keras steps")
        request(run_dir, id="a1", steps=10)  # the program's session runs: whyidle steps aside
        _wait_for(lambda: _records(run_dir, "trace_window"), what="the first record")
        open(marker, "w").close()
        request(run_dir, id="a2", steps=50)  # the program starts its own as it sees whyidle's
        _wait_for(lambda: len(_records(run_dir, "trace_window")) == 2, what="the second record")
    except BaseException:
        proc.kill()
        raise
    result = _finish(proc)
    recs = _records(run_dir, "trace_window")
    assert [(r["id"], r["error"], r["file"]) for r in recs] == [("a1", STEPPED_ASIDE, None), ("a2", DISCARDED, None)]
    assert result["grabbed"]
    for mine in ("mine1", "mine2"):  # the program's own traces are complete
        assert glob.glob(str(tmp_path / mine / "plugins" / "profile" / "*" / "*.xplane.pb")), mine
    assert not glob.glob(os.path.join(run_dir, "traces", "*", "plugins", "profile", "*", "*.xplane.pb"))


@pytest.mark.slow
@needs("jax")
def test_a_keras_run_on_jax_answers_that_it_needs_tensorflow(tmp_path):
    proc, run_dir = _launch(tmp_path, "jax", "8")
    try:
        _wait_for(lambda: _records(run_dir, "step"), what="the first Keras steps")
        request(run_dir, id="j1", steps=10)
        _wait_for(lambda: _records(run_dir, "trace_window"), what="the record")
    except BaseException:
        proc.kill()
        raise
    _finish(proc)
    [rec] = _records(run_dir, "trace_window")
    assert rec["error"] == NEEDS_TF.format(backend="jax") and rec["steps"] == 0 and rec["file"] is None
    assert not os.path.exists(os.path.join(run_dir, "traces"))
