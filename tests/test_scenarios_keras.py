"""Keras / TensorFlow scenarios under `whyidle run` (tests/scenarios/, CPU-only box).

Each test runs a plain Keras 3 / TensorFlow training script unchanged under ``whyidle run`` and
checks the report contract (../shared/DESIGN.md): framework, verdict, the key evidence, and for C03
that the fixed variant is measurably faster by whyidle's own samples/s. The scripts' docstrings
hold their calibration on the 2-core dev box; the thresholds here leave room for a noisy machine.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import SCENARIOS, finding, needs, observe

#: every test starts real processes; those that assert measured speeds or shares also run alone (timing)
pytestmark = [pytest.mark.slow, needs("tensorflow")]


RESULT = re.compile(r"^RESULT samples_per_s=[0-9.]+ step_s=[0-9.]+$", re.M)

C03 = "c03_tfdata_sequential_map.py"


def scenario(tmp_path, script, *args, framework="keras", timeout=300):
    """Runs a scenario under whyidle; checks exit code 0, a report, its framework and the script's
    RESULT line in the passed-through stdout. Returns (proc, report)."""
    name = os.path.splitext(script)[0] + "".join(a.strip("-") for a in args)[:40]
    proc, report, _ = observe(tmp_path, [sys.executable, os.path.join(SCENARIOS, script), *args],
                              timeout=timeout, name=name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None, proc.stderr[-3000:]
    assert report["framework"] == framework, (report["framework"], proc.stderr[-2000:])
    assert RESULT.search(proc.stdout), proc.stdout[-2000:]
    return proc, report


def sps(report) -> float:
    return report["metrics"]["samples_per_s"]


def data_wait(report) -> float:
    return report["metrics"]["shares"]["data_wait"]


def findings_summary(report) -> list:
    return [(f["id"], f["severity"], f.get("est_speedup"), f["evidence"].get("cause")) for f in report["findings"]]


# -- C03: sequential tf.data map, no prefetch ------------------------------------------------------

@pytest.mark.timing
def test_c03_sequential_map_is_input_bound_and_the_fix_helps(tmp_path):
    _, faulty = scenario(tmp_path, C03, "--variant", "faulty", "--steps", "30")
    assert faulty["verdict"] == "input_bound", findings_summary(faulty)
    # measured ~0.64 without whyidle, 0.45 under it on a quiet box (its TF profiler window slows the
    # step), 0.32-0.38 under load: asserted loosely here, and against the fixed run below
    assert data_wait(faulty) >= 0.25
    f = finding(faulty, "input_bound")
    ev = f["evidence"]
    assert ev["cause"] == "sequential_map", ev
    assert ev["input_wait_method"] == "tf_profiler", ev
    # by how much the input limits the step, and the two tf.data lines to change
    assert f"{data_wait(faulty):.0%} of each step" in f["summary"], f["summary"]
    assert f["est_speedup"] >= 1.5, f["est_speedup"]
    lines = f["fix"]["code"].splitlines()
    assert len(lines) == 2 and all(line.startswith("ds = ds.") for line in lines), lines
    assert "num_parallel_calls=tf.data.AUTOTUNE" in lines[0], f["fix"]
    assert lines[1] == "ds = ds.prefetch(tf.data.AUTOTUNE)", f["fix"]

    _, fixed = scenario(tmp_path, C03, "--variant", "fixed", "--steps", "30")
    assert fixed["verdict"] != "input_bound", findings_summary(fixed)
    assert data_wait(fixed) < 0.15  # measured ~0.03 without whyidle
    assert data_wait(faulty) >= 4 * data_wait(fixed), (data_wait(faulty), data_wait(fixed))
    # measured 2.3x without whyidle (script docstring)
    assert sps(fixed) >= 1.5 * sps(faulty), (sps(fixed), sps(faulty))


# -- other Keras / TF pipelines ---------------------------------------------------------------------

@pytest.mark.timing
def test_generator_source_is_input_bound_on_python(tmp_path):
    _, report = scenario(tmp_path, "keras_generator_source.py", "--steps", "30")
    assert report["verdict"] == "input_bound", findings_summary(report)
    assert data_wait(report) >= 0.5  # measured 0.81-0.86 without whyidle
    assert finding(report, "input_bound")["evidence"]["cause"] == "python_in_pipeline"


@pytest.mark.timing
def test_cached_in_memory_data_with_heavy_model_is_device_bound(tmp_path):
    _, report = scenario(tmp_path, "keras_cached_compute.py", "--steps", "25")
    assert report["verdict"] == "device_bound", findings_summary(report)
    assert data_wait(report) < 0.1  # measured ~0.01 without whyidle
    assert finding(report, "input_bound") is None
    assert finding(report, "host_bound") is None


@pytest.mark.timing
def test_logging_callback_is_host_bound_and_named(tmp_path):
    _, report = scenario(tmp_path, "keras_logging_callback.py", "--steps", "30")
    assert report["verdict"] == "host_bound", findings_summary(report)
    f = finding(report, "host_bound")
    ev = f["evidence"]
    places = [ev["focus"]] if ev.get("focus") else []
    places += ev.get("hotspots") or []
    named = [p for p in places if "log_batch" in p.get("function", "")
             and "keras_logging_callback.py" in p.get("function", "") + " " + p.get("site", "")]
    assert named, places
    assert data_wait(report) < 0.2
    assert "batch % 50" in f["fix"]["code"], f["fix"]


@pytest.mark.timing
def test_custom_training_loop_is_input_bound(tmp_path):
    _, report = scenario(tmp_path, "tf_custom_loop.py", framework="tensorflow")
    assert report["metrics"]["steps"] >= 10
    assert data_wait(report) >= 0.4  # measured ~0.91 without whyidle
    assert report["verdict"] == "input_bound", findings_summary(report)


# -- Keras 3 on the torch and JAX backends ----------------------------------------------------------

BACKENDS = ["torch", pytest.param("jax", marks=needs("jax"))]
#: Findings other tenants of the shared box can cause in any run (not the program's).
NOT_THE_PROGRAMS = {"cpu_contention"}


@pytest.mark.timing
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_healthy_keras_run_on_torch_and_jax_raises_no_alarm(tmp_path, backend):
    """An MLP on in-memory arrays: the input wait is measured (Keras slices the arrays in
    microseconds), the step is the model's, nothing is worth a warning; on JAX the first step's
    jit compilation is start-up and the steps are on the computation's pace."""
    _, report = scenario(tmp_path, "keras_torch_backend.py", "--backend", backend)
    assert report["metrics"]["steps"] >= 20 and report["metrics"]["samples_per_s"] > 0
    assert report["metrics"]["gpu"] is None  # CPU-only box: null, never zeros
    assert report["keras"]["input_wait"]["method"] == "fit_input"
    assert data_wait(report) < 0.1
    alarms = [f for f in findings_summary(report) if f[1] != "info" and f[0] not in NOT_THE_PROGRAMS]
    assert not alarms, findings_summary(report)
    assert report["verdict"] in {"device_bound"} | NOT_THE_PROGRAMS, findings_summary(report)
    assert not any("not measured" in n or "not separated" in n for n in report["notes"]), report["notes"]
    if backend == "jax":
        startup = report["metrics"]["time"]["parts"]["startup"]
        assert startup["split"]["first_step_s"] >= 0.1  # the jit compilation (0.6-1.7 s measured)
        assert report["metrics"]["time"]["parts"]["evaluation"]["s"] < 0.2  # Keras's wait for the computation is not


@pytest.mark.timing
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pydataset_decoding_every_batch_is_input_bound_with_the_keras_fix(tmp_path, backend):
    """The issue's case: a PyDataset with the default workers=1 decoding JPEGs in __getitem__
    (tests/scenarios/keras_pydataset_decode.py): input_bound in Keras terms (cache the decoded
    arrays first, PyDataset workers as an option, nothing of TensorFlow), and the fixed variant,
    decoded once, several times faster and waiting little (measured 2.8-3.1x on torch, 3.2x on
    JAX; whyidle's estimates 2.92x and 2.52x; with 400-pixel photos, 2026-12-05 on an AVX2 EPYC VM:
    3.5x on both, estimates 3.41x and 2.57x)."""
    _, faulty = scenario(tmp_path, "keras_pydataset_decode.py", "--backend", backend)
    assert faulty["verdict"] == "input_bound", findings_summary(faulty)
    f = finding(faulty, "input_bound")
    ev = f["evidence"]
    assert ev["cause"] == "python_in_pipeline" and ev["fit_input"] == "PyDataset" and ev["workers_now"] == 0
    assert ev["input_wait_method"] == "fit_input" and "keras_pydataset_decode.py" in ev["input_source"]
    assert data_wait(faulty) >= 0.5  # measured 0.70-0.71 on torch, 0.60 on JAX; 400-pixel photos: 0.75, 0.61
    assert "Decode once" in f["fix"]["text"] and "class Photos(keras.utils.PyDataset)" in f["fix"]["code"]
    assert any("PyDataset(workers=2" in o["text"] for o in f["fix"]["options"]), f["fix"]["options"]
    everything = " ".join(o["text"] + (o["code"] or "") for o in f["fix"]["options"]) + f["summary"]
    assert "tf." not in everything and "tf.function" not in everything
    assert ev["decode_share"] >= 0.6  # measured 0.93-0.95

    _, fixed = scenario(tmp_path, "keras_pydataset_decode.py", "--backend", backend, "--variant", "fixed")
    # what is left of the loading (crop, flip, Keras's conversion) is a small part of a much shorter step
    assert data_wait(fixed) <= data_wait(faulty) / 3, (data_wait(fixed), data_wait(faulty))
    left = finding(fixed, "input_bound")
    assert left is None or left["severity"] != "critical", findings_summary(fixed)
    measured = sps(fixed) / sps(faulty)
    assert measured >= 2.0, (sps(fixed), sps(faulty))
    assert 0.5 <= f["est_speedup"] / measured <= 2.0, (f["est_speedup"], measured)
