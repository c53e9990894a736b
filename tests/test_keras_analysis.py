"""Keras steps → input wait and compute (whyidle.analysis.keras), step selection and storage of
Keras/iterator steps. Pure: no TensorFlow needed."""

from __future__ import annotations

import pytest

from whyidle.analysis import keras as keras_analysis
from whyidle.analysis import steps as step_analysis
from whyidle.record.steptable import StepTable

MS = 1_000_000


def keras_steps(n=12, fn_ms=80, host_ms=5, profiled=range(4, 7)):
    out, t = [], 0
    for i in range(n):
        dur = (fn_ms + host_ms) * MS
        out.append({"k": "step", "i": i, "t0": t, "t1": t + dur, "by": "keras", "fn": fn_ms * MS, "batches": 1,
                    "samples": 32, "boundary": False, "profiled": i in profiled})
        t += dur
    return out


def window(calls, **extra):
    return dict({"k": "tf_window", "method": "tf_profiler", "calls": calls, "fn_name": "multi_step_on_iterator",
                 "iterators": [["Iterator::Root::MapAndBatch", 3, 200.0]], "file": "tfprof-1/x.xplane.pb"}, **extra)


def test_window_ratio_applied_to_all_steps_and_own_values_to_profiled_steps():
    steps = keras_steps()
    # three profiled calls: 78 ms train function each, 60 / 66 / 72 ms of IteratorGetNext
    calls = [[78 * MS, 60 * MS], [78 * MS, 66 * MS], [78 * MS, 72 * MS]]
    out, info = keras_analysis.input_wait(steps, [window(calls)])
    ratio = (60 + 66 + 72) / (3 * 78)
    assert info["method"] == "tf_profiler" and info["calls"] == 3
    assert info["ratio"] == pytest.approx(ratio)
    assert info["get_next_ms_mean"] == pytest.approx(66.0) and info["fn_ms_mean"] == pytest.approx(78.0)
    by_i = {s["i"]: s for s in out}
    assert by_i[0]["data"] == int(80 * MS * ratio)  # not profiled: the window's ratio × its own fn
    assert by_i[4]["data"] == int(80 * MS * 60 / 78)  # profiled: its own call
    assert by_i[6]["data"] == int(80 * MS * 72 / 78)
    for s in out:
        assert s["data"] + s["comp"] == s["fn"]
    m = step_analysis.step_metrics(out)
    assert m["shares"]["data_wait"] == pytest.approx(sum(s["data"] for s in out) / sum(85 * MS for _ in out))
    assert m["shares"]["compute"] + m["shares"]["data_wait"] == pytest.approx(80 / 85)
    assert m["shares"]["other_host"] == pytest.approx(5 / 85)


def test_misaligned_window_uses_the_ratio_everywhere():
    steps = keras_steps(profiled=range(4, 6))  # 2 profiled steps, 3 calls: no one-to-one match
    calls = [[50 * MS, 25 * MS]] * 3
    out, info = keras_analysis.input_wait(steps, [window(calls)])
    assert all(s["data"] == 40 * MS for s in out)


def test_get_next_longer_than_the_call_is_clipped():
    out, info = keras_analysis.input_wait(keras_steps(profiled=()), [window([[10 * MS, 30 * MS]])])
    assert info["ratio"] == 1.0 and all(s["comp"] == 0 for s in out)


@pytest.mark.parametrize("records, reason", [
    ([], "no TensorFlow profiler window ran"),
    ([{"k": "tf_window", "method": "tf_profiler", "error": "DecodeError('bad')"}], "could not be read: DecodeError"),
    ([window([])], "no TensorFlow profiler window ran"),
])
def test_without_a_window_the_input_wait_is_unknown_not_zero(records, reason):
    out, info = keras_analysis.input_wait(keras_steps(), records)
    assert info["method"] is None and reason in info["reason"]
    assert all(s["data"] is None and s["comp"] == s["fn"] for s in out)
    m = step_analysis.step_metrics(out)
    assert m["shares"]["data_wait"] == 0.0 and m["shares"]["compute"] == pytest.approx(80 / 85)


def test_iterator_and_torch_steps():
    it = [{"i": 0, "t0": 0, "t1": 10, "by": "iterator", "data": 4, "comp": 5}]
    assert keras_analysis.input_wait(it, [])[1] == {"method": "iterator", "reason": None}
    torch_steps = [{"i": 0, "t0": 0, "t1": 10, "by": "optimizer", "data": 4}]
    assert keras_analysis.input_wait(torch_steps, []) == (torch_steps, None)
    assert keras_analysis.input_wait([], []) == ([], None)


def test_steps_of_prefers_keras_steps():
    recs = keras_steps(3) + [{"k": "step", "i": 9, "t0": 0, "t1": 1, "by": "optimizer"},
                             {"k": "step", "i": 10, "t0": 0, "t1": 1, "by": "loader"}]
    assert [s["by"] for s in step_analysis.steps_of(recs)] == ["keras"] * 3
    table = StepTable()
    for r in recs:
        table.add(r)
    rows = step_analysis.steps_of(table)
    assert [s["by"] for s in rows] == ["keras"] * 3
    assert rows[0]["fn"] == 80 * MS and rows[0]["comp"] is None and rows[0].get("comp") is None


def test_steptable_keeps_keras_fields():
    table = StepTable()
    table.add({"i": 0, "t0": 0, "t1": 5, "by": "iterator", "data": 2, "comp": 3, "profiled": True})
    row = table.rows()[0]
    assert (row["by"], row["data"], row["comp"], row["profiled"], row["fn"]) == ("iterator", 2, 3, True, None)


def test_profiled_steps_left_out_when_enough_others_remain():
    steps = keras_steps(n=20, profiled=range(3, 13))
    analyzed, info = step_analysis.select_steps(steps)
    assert info["profiled_excluded"] == 10 and not any(s["profiled"] for s in analyzed)
    assert len(analyzed) == 20 - 2 - 10
    few = keras_steps(n=12, profiled=range(2, 12))  # nothing else left: keep them
    analyzed, info = step_analysis.select_steps(few)
    assert info["profiled_excluded"] == 0 and len(analyzed) == 10


def test_torch_steps_have_no_compute_share():
    steps = [{"i": i, "t0": i * 10, "t1": i * 10 + 10, "by": "optimizer", "data": 2, "fwd": 3} for i in range(4)]
    assert "compute" not in step_analysis.step_metrics(steps)["shares"]


def test_iteration_without_training_is_not_steps():
    reading = [{"i": i, "t0": i, "t1": i + 1, "by": "iterator", "data": 1, "comp": 0, "grad": 0} for i in range(20)]
    steps, info = keras_analysis.input_wait(reading, [])
    assert steps == [] and info["method"] is None and "it does not train" in info["reason"]
    eager = [dict(s, grad=1) for s in reading]  # an eager GradientTape loop, no tf.function
    assert keras_analysis.input_wait(eager, [])[1]["method"] == "iterator"


def test_steps_marked_by_an_abandoned_window_are_ordinary_steps():
    steps, info = keras_analysis.input_wait(keras_steps(), [])
    assert not any(s["profiled"] for s in steps)


# -- the torch and JAX backends: each batch's fetch timed ------------------------------------------

US = 1000
DATA, OTHER, COMPUTE = 1, 6, 7  # PHASE_CODES


def jax_steps(n, data_ms, dispatch_ms=1, host_ms=1):
    """Host-side JAX steps: the train function (dispatch) fetches the batch first (data inside it),
    then the loop's own work; as recorded by whyidle.instrument.keras."""
    out, t = [], 0
    for i in range(n):
        fn = (data_ms + dispatch_ms) * MS
        dur = fn + host_ms * MS
        ph = [COMPUTE, 0, DATA, 0, COMPUTE, data_ms * MS // US, OTHER, fn // US]
        out.append({"k": "step", "i": i, "t0": t, "t1": t + dur, "by": "keras", "fn": fn, "data": data_ms * MS,
                    "comp": dispatch_ms * MS, "batches": 1, "samples": 32, "boundary": i == 0, "ph": ph})
        t += dur
    return out


def test_measured_batches_are_the_input_wait():
    steps = jax_steps(5, data_ms=8)
    out, info = keras_analysis.input_wait(steps, [])
    assert out == steps and info == {"method": "fit_input", "reason": None}


def test_jax_steps_take_the_pace_of_a_slower_computation():
    """The loop (10 ms a step) runs ahead of a computation that takes 30 ms a step: the steps are
    30 ms apart, all computation, and the batch fetches that overlapped it cost nothing."""
    steps = jax_steps(10, data_ms=8)
    done = [[s["i"], 100 * MS + 30 * MS * s["i"]] for s in steps]
    out, info = keras_analysis.input_wait(steps, [{"k": "keras_done", "t": 0, "done": done}])
    assert info["method"] == "fit_input"
    assert [s["t1"] - s["t0"] for s in out[1:]] == [30 * MS] * 9
    assert all(s["data"] == 0 and s["comp"] == 30 * MS for s in out[1:])
    assert out[0]["t0"] == 0 and out[0]["t1"] == 100 * MS  # the first step (its jit compilation) where it began
    m = step_analysis.step_metrics(out[2:])
    assert m["shares"]["compute"] == pytest.approx(1.0) and m["shares"]["data_wait"] == 0.0


@pytest.mark.parametrize("compute_ms, data, comp", [(0.5, 8, 1.5), (3, 6, 4)])
def test_jax_steps_waiting_for_the_loop_count_its_batch_fetch(compute_ms, data, comp):
    """The loop takes 10 ms a step (8 ms fetching the batch, 1 ms dispatching, 1 ms of its own), the
    computation less: the steps keep the loop's pace. A computation of 0.5 ms ends before the next
    fetch starts: the whole fetch is waited for. One of 3 ms runs through the next fetch's first
    2 ms, which cost nothing."""
    steps = jax_steps(10, data_ms=8)
    done = [[s["i"], s["t0"] + s["fn"] + int(compute_ms * MS)] for s in steps]
    out, _ = keras_analysis.input_wait(steps, [{"k": "keras_done", "t": 0, "done": done}])
    steady = out[2:]
    assert all(s["t1"] - s["t0"] == 10 * MS for s in steady)
    assert all(s["data"] == data * MS and s["comp"] == comp * MS for s in steady), steady[0]
    m = step_analysis.step_metrics(steady)
    assert m["shares"]["data_wait"] == pytest.approx(data / 10)
    assert m["shares"]["other_host"] == pytest.approx(1 - (data + comp) / 10)


def test_steps_without_a_completion_keep_their_own_times():
    steps = jax_steps(4, data_ms=8)
    done = [[0, steps[0]["t1"]], [1, steps[1]["t1"] + MS]]
    out, _ = keras_analysis.input_wait(steps, [{"k": "keras_done", "t": 0, "done": done}])
    assert out[1]["t1"] == steps[1]["t1"] + MS and out[2] == steps[2] and out[3] == steps[3]


def test_decoding_share_counts_the_functions_that_mostly_decode():
    """The data wait's samples: a ``decode`` function whose samples are mostly inside PIL (its own
    np.asarray line too), and ``__getitem__``'s crop/flip in numpy: 8 of 10 samples are decoding."""
    from whyidle.analysis.stacks import DECODE_LEAVES, function_leaf_share, leaf_share

    sites = [["data", "train.py:12 decode", "PIL/ImageFile.py:300 load", 6, 60],
             ["data", "train.py:13 decode", "train.py:13 decode", 2, 20],  # np.asarray(image): the pixel copy
             ["data", "train.py:30 __getitem__", "numpy/core/fromnumeric.py:50 copy", 2, 20],
             ["other", "train.py:40 main", "keras/src/x.py:1 f", 5, 50]]
    recs = [{"k": "stacks", "t": 0, "hz": 100, "n": 15, "sites": sites}]
    assert function_leaf_share(recs, "data", DECODE_LEAVES) == pytest.approx(0.8)
    assert leaf_share(recs, "data", DECODE_LEAVES) == pytest.approx(0.6)  # the leaves alone miss the copy
    assert function_leaf_share(recs, "forward", DECODE_LEAVES) is None
