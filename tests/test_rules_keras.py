"""Keras / TensorFlow rules on hand-built facts (pure: no TensorFlow)."""

from __future__ import annotations

import pytest

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import diagnose, rules_keras

MB = 1 << 20


def stage(op, **kw):
    return dict({"op": op, "cls": op, "parallel": None, "buffer": None, "batch_size": None}, **kw)


SEQUENTIAL_PY_MAP = {"stages": [stage("range", cardinality=3000),
                                stage("map", fn="tf_load", fn_site="train.py:16", py_func=True, fn_ops=1),
                                stage("batch", batch_size=32, drop_remainder=False)],
                     "cardinality": -1, "batch_size": 32, "source_elements": 3000,
                     "options": {"autotune": True, "inject_prefetch": True, "map_parallelization": True,
                                 "map_and_batch_fusion": True}}
FIXED = {"stages": [stage("range", cardinality=3000),
                    stage("map", fn="tf_load", py_func=True, fn_ops=1, parallel=-1),
                    stage("batch", batch_size=32), stage("prefetch", buffer=-1)],
         "cardinality": -1, "batch_size": 32, "options": SEQUENTIAL_PY_MAP["options"]}


def facts(data_share=0.86, step_s=0.078, pipeline=SEQUENTIAL_PY_MAP, method="tf_profiler", cores=2, **extra):
    data = data_share * step_s
    f = {
        "framework": "keras", "primary": 1, "instrumented": [1], "steps_info": {"total": 80},
        "step": {"steps": 60, "shares": {"data_wait": data_share, "forward": 0.0, "backward": 0.0, "optimizer": 0.0,
                                         "eval": 0.0, "compute": 1 - data_share - 0.01, "other_host": 0.01},
                 "step_time_s": {"p50": step_s, "p90": step_s, "mean": step_s}, "data_wait_s_per_step": data,
                 "compute_s_per_step": step_s - data, "batch_size": 32, "batches_per_step": 1,
                 "samples_per_s": 32 / step_s},
        "host": {"cores": cores, "cpu_busy_share": 0.6},
        "input_wait": {"method": method, "calls": 10, "ratio": data_share, "iterators": []} if method else
                      {"method": None, "reason": "no TensorFlow profiler window ran (see the notes)"},
        "tfdata": pipeline, "host_mem_total_bytes": 24 << 30, "device": {"kind": "cpu"},
    }
    f.update(extra)
    return RunFacts(**f)


def test_c03_sequential_python_map_is_input_bound_with_the_two_lines():
    f = rules_keras.input_bound(facts())
    assert f["id"] == "input_bound" and f["severity"] == "critical"
    ev = f["evidence"]
    assert ev["cause"] == "sequential_map" and ev["input_wait_method"] == "tf_profiler" and ev["input_wait_steps"] == 10
    assert ev["data_wait_share"] == pytest.approx(0.86)
    # the fix model: 67 ms of loading per step over 2 parallel calls, overlapped with 11 ms of the rest
    assert ev["predicted_step_s"] == pytest.approx(0.86 * 0.078 / 2, abs=1e-4)  # evidence rounded to 4 digits
    assert f["est_speedup"] == pytest.approx(0.078 / (0.86 * 0.078 / 2), rel=1e-3)
    assert "86% of each step" in f["summary"] and "TensorFlow profiler over 10 steps" in f["summary"]
    assert "num_parallel_calls=tf.data.AUTOTUNE" in f["fix"]["code"]
    assert "ds = ds.prefetch(tf.data.AUTOTUNE)" in f["fix"]["code"]
    assert "GIL" in f["fix"]["text"]


def test_more_cores_more_gain_but_never_more_than_removing_the_wait():
    two = rules_keras.input_bound(facts(cores=2))["est_speedup"]
    many = rules_keras.input_bound(facts(cores=64))["est_speedup"]
    assert two < many <= 1 / (1 - 0.86) + 1e-3


def test_generator_source_is_python_in_pipeline():
    gen = {"stages": [stage("generator", fn="rows", py_func=True), stage("batch", batch_size=32),
                      stage("prefetch", buffer=-1)], "options": SEQUENTIAL_PY_MAP["options"]}
    f = rules_keras.input_bound(facts(pipeline=gen))
    assert f["evidence"]["cause"] == "python_in_pipeline"
    # moving the Python work out of the pipeline removes the wait: 1/(1 - 0.86)
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.86), rel=1e-3)
    assert f["evidence"]["predicted_step_s"] == pytest.approx(0.078, abs=1e-4)  # parallel calls alone: no gain


def test_a_python_generator_passed_to_fit_is_named_with_a_batch_level_fix():
    """``model.fit(gen())``: Keras wraps the generator itself (no tf.data pipeline of the
    program's to lint); the cause is still the Python source, named at its line, with the
    vectorized-batch fix first and worker processes (``PyDataset``) as an option."""
    calls = [{"k": "keras_call", "fn": "fit", "input": "generator", "source": "train.py:26 gen"}]
    f = rules_keras.input_bound(facts(pipeline=None, keras_calls=calls))
    ev = f["evidence"]
    assert ev["cause"] == "python_in_pipeline" and ev["fit_input"] == "generator" and ev["input_source"] == "train.py:26 gen"
    assert "`gen` at train.py:26" in f["summary"] and "`gen` (train.py:26)" in f["fix"]["text"]
    assert "tf.data" not in f["fix"]["text"]
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.86), rel=1e-3)
    assert [o["est_speedup"] for o in f["fix"]["options"]][1:] == [None]
    assert "use_multiprocessing=True" in f["fix"]["options"][1]["code"]
    # without a known fit input it stays unknown
    assert rules_keras.input_bound(facts(pipeline=None))["evidence"]["cause"] == "unknown"


def test_parallel_prefetched_pipeline_is_cpu_preprocessing():
    f = rules_keras.input_bound(facts(pipeline=FIXED, data_share=0.5))
    assert f["evidence"]["cause"] in ("cpu_preprocessing", "python_in_pipeline")
    assert f["severity"] == "critical"


def test_quiet_below_the_threshold_and_silent_without_measurement():
    assert rules_keras.input_bound(facts(data_share=0.05)) is None
    assert rules_keras.input_bound(facts(method=None)) is None


def test_unmeasured_input_wait_is_never_called_device_bound_silently():
    verdict, findings = diagnose(facts(method=None, data_share=0.0))
    assert verdict == "device_bound"
    note = findings[0]
    assert note["id"] == "device_bound" and note["evidence"]["input_wait_measured"] is False
    assert "was not measured (no TensorFlow profiler window ran" in note["summary"]
    assert "jit_compile=True" in note["fix"]["text"]
    verdict, findings = diagnose(facts(data_share=0.02))
    assert findings[0]["evidence"]["input_wait_measured"] is True and "not measured" not in findings[0]["summary"]


def test_config_finding_only_for_smells_not_already_fixed():
    verdict, findings = diagnose(facts())
    assert verdict == "input_bound"
    assert [f["id"] for f in findings] == ["input_bound"]  # its fix code already holds every line
    quiet = facts(data_share=0.02)
    verdict, findings = diagnose(quiet)
    config = next(f for f in findings if f["id"] == "input_pipeline_config")
    assert config["severity"] == "info" and "sequential_map" in config["evidence"]["smells"]
    assert "num_parallel_calls=tf.data.AUTOTUNE" in config["fix"]["code"]


def gpu_facts(physical, cuda_build=True):
    return facts(tf_devices={"physical_gpus": physical, "is_cuda_build": cuda_build, "cuda_build": "12.5.1",
                             "cudnn_build": "9", "tf_version": "2.21.0"},
                 gpu_static={"devices": [{"index": 0, "cuda_driver_version": "12.2"}]})


def test_gpu_not_visible_to_tensorflow():
    f = rules_keras.gpu_not_visible(gpu_facts(0))
    assert f["severity"] == "critical"
    assert "CUDA 12.5.1" in f["summary"] and "CUDA 12.2" in f["summary"]
    cpu_build = rules_keras.gpu_not_visible(gpu_facts(0, cuda_build=False))
    assert "CPU-only build" in cpu_build["summary"] and "tensorflow[and-cuda]" in cpu_build["fix"]["code"]
    assert rules_keras.gpu_not_visible(gpu_facts(1)) is None
    assert rules_keras.gpu_not_visible(facts()) is None  # no NVML GPU
    verdict, _ = diagnose(gpu_facts(0))
    assert verdict == "gpu_not_visible"


def test_no_steps_message_names_keras():
    verdict, findings = diagnose(RunFacts(**{"framework": "tensorflow", "primary": None, "instrumented": [5]}))
    assert verdict == "unknown" and "Keras/TensorFlow was imported" in findings[0]["summary"]


def mp_facts(cc, policy="float32"):
    from whyidle.analysis.run import _keras_devices

    tfd = {"physical_gpus": 1, "backend": "tensorflow", "policy": policy, "weight_dtypes": {"float32": 6}}
    return facts(data_share=0.02, devices=_keras_devices(tfd)[0],
                 device={"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB" if cc == (8, 0) else "Tesla P100",
                         "compute_capability": list(cc), "memory_total_bytes": 80 << 30})


def test_keras_mixed_precision_policy_only_with_tensor_cores():
    from whyidle.diagnose import rules_work

    f = rules_work.no_mixed_precision(mp_facts((8, 0)))
    assert f["severity"] == "warning" and f["est_speedup"] > 1.2
    assert 'set_global_policy("mixed_bfloat16")' in f["fix"]["code"]
    assert 'dtype="float32"' in f["fix"]["code"] and "output layer in float32" in f["fix"]["text"]
    old = rules_work.no_mixed_precision(mp_facts((6, 0)))
    assert old["severity"] == "info" and old["est_speedup"] is None and "not help much" in old["summary"]
    assert rules_work.no_mixed_precision(mp_facts((8, 0), policy="mixed_float16")) is None


def with_trainer(f, cores_used):
    f.host = dict(f.host, trainer_cores=cores_used)
    return f


STATELESS_SEQUENTIAL = {"stages": [stage("files", cardinality=2000), stage("map", fn="decode", fn_ops=12, stateful=True),
                                   stage("batch", batch_size=32), stage("prefetch", buffer=-1)],
                        "options": SEQUENTIAL_PY_MAP["options"]}


def test_cpu_floor_caps_the_parallel_map_estimate():
    # 3.4 ms steps, half of it waiting on a sequential decode map, the process using 1.5 of 2 cores:
    # 5.1 ms of CPU per step cannot take less than 2.55 ms on 2 cores, whatever the parallelism
    f = rules_keras.input_bound(with_trainer(facts(data_share=0.5, step_s=0.0034, pipeline=STATELESS_SEQUENTIAL), 1.5))
    assert f["evidence"]["cause"] == "sequential_map"
    assert f["evidence"]["cpu_floor_s"] == pytest.approx(0.00255, abs=1e-4)
    assert f["est_speedup"] == pytest.approx(0.0034 / 0.00255, rel=0.02)  # 1.33x (measured 1.35-1.4x)


def test_python_map_that_looks_cpu_bound_says_so_and_is_bounded_by_the_cpu():
    # the process uses 1.2 cores: the estimate stops at its CPU per step over the 2 cores, and the
    # text says the map's Python may be the limit
    f = rules_keras.input_bound(with_trainer(facts(), 1.2))
    assert f["evidence"]["cause"] == "sequential_map"
    assert f["evidence"]["load_cpu_share"] == pytest.approx(1.0)
    assert f["est_speedup"] == pytest.approx(0.078 / (1.2 * 0.078 / 2), rel=0.01)  # 1.67x
    assert "looks like CPU work" in f["fix"]["text"] and "1.2 cores" in f["fix"]["text"]


def test_python_map_that_waits_keeps_parallel_calls():
    # C03: sleep-bound Python, 0.6 cores used: two parallel calls (the cores) overlap the waiting
    f = rules_keras.input_bound(with_trainer(facts(step_s=0.094, data_share=0.56), 0.6))
    assert f["evidence"]["cause"] == "sequential_map" and f["evidence"]["parallel_gain"] == pytest.approx(2.0)
    assert f["est_speedup"] == pytest.approx(0.094 / (0.094 * 0.44), rel=0.01)


def test_waiting_python_already_parallel_gets_more_calls_than_cores():
    parallel_py = {"stages": [stage("range"), stage("map", fn="fetch", py_func=True, fn_ops=1, parallel=-1),
                              stage("batch", batch_size=32), stage("prefetch", buffer=-1)],
                   "options": SEQUENTIAL_PY_MAP["options"]}
    f = rules_keras.input_bound(with_trainer(facts(data_share=0.95, step_s=0.1, pipeline=parallel_py), 0.03))
    ev = f["evidence"]
    assert ev["cause"] == "python_in_pipeline" and ev["parallel_gain"] == pytest.approx(8.0)  # 16 calls / 2 cores
    # loading 0.1 s per step (prefetched: wait + rest) over 8× the calls, against 5 ms of the rest
    assert f["est_speedup"] == pytest.approx(0.1 / (0.1 / 8), rel=0.01)
    assert "num_parallel_calls=16" in f["fix"]["text"] and "private_threadpool_size = 16" in f["fix"]["text"]


def test_keras_small_batch_counts_the_compiled_steps_fixed_cost():
    from whyidle.diagnose import rules_batch

    f = facts(data_share=0.02, step_s=0.00045)
    f.step["batch_size"] = 8
    sb = rules_batch.small_batch(f)
    # 0.3 ms of the 0.45 ms step is the compiled step's fixed cost, 1 % other host: batch 32 gives ~2.2x
    fixed = 0.01 + 0.0003 / 0.00045
    assert sb["est_speedup"] == pytest.approx(4 / (fixed + (1 - fixed) * 4), rel=1e-3)
    assert sb["severity"] == "warning" and "ds = ds.batch(32)" in sb["fix"]["code"]
    assert "model.fit(x, y, batch_size=32" in sb["fix"]["code"] and "DataLoader" not in sb["fix"]["code"]


# -- Keras on the torch and JAX backends -----------------------------------------------------------

def backend_facts(backend, data_share=0.8, step_s=0.06, fit=None, decode=0.9, trainer_cores=1.0, compute=None,
                  **extra):
    """A Keras run on ``backend`` whose every batch fetch was timed (``fit_input``), fed by a
    ``PyDataset`` with the default ``workers=1`` (``fit`` overrides the ``keras_call``)."""
    call = {"k": "keras_call", "fn": "fit", "input": "PyDataset", "source": "train.py:30 __getitem__",
            "workers": 1, "use_multiprocessing": False, "max_queue_size": 10, "input_class": "Photos",
            "input_init": "train.py:24", "input_kwargs": True, "site": "train.py:60"}
    call.update(fit or {})
    f = facts(data_share=data_share, step_s=step_s, pipeline=None, method="fit_input", keras_calls=[call],
              proc={"framework": "keras", "backend": backend}, data_decode_share=decode, **extra)
    f.input_wait = {"method": "fit_input", "reason": None}
    f.host = dict(f.host, trainer_cores=trainer_cores)
    if compute is not None:
        f.step["shares"].update(compute=compute, other_host=1 - data_share - compute)
    return f


def test_a_pydataset_decoding_in_the_training_thread_gets_the_cache_fix_in_keras_terms():
    """The issue's case: Keras on torch, a PyDataset with workers=1 decoding images per batch.
    Decoding holds 90 % of the 48 ms wait: keeping the decoded arrays leaves 16.8 ms of the 60 ms
    step. Worker processes are the other option, each estimated; nothing speaks TensorFlow."""
    f = rules_keras.input_bound(backend_facts("torch"))
    ev = f["evidence"]
    assert ev["cause"] == "python_in_pipeline" and ev["fit_input"] == "PyDataset"
    assert ev["input_wait_method"] == "fit_input" and ev["workers_now"] == 0
    assert "built in the training thread" in f["summary"] and "`__getitem__` at train.py:30" in f["summary"]
    assert f["est_speedup"] == pytest.approx(0.06 / (0.06 - 0.9 * 0.8 * 0.06), rel=1e-3)
    assert "Decode once" in f["fix"]["text"] and "class Photos(keras.utils.PyDataset)" in f["fix"]["code"]
    workers = next(o for o in f["fix"]["options"] if "worker processes" in o["text"])
    # 48 ms of loading over 2 processes beside 12 ms of the rest, floored by 60 ms of CPU over 2 x 0.85 cores
    assert workers["est_speedup"] == pytest.approx(0.06 / max(0.012, 0.048 / 2, 0.06 / 1.7), rel=1e-3)
    assert "Photos(..., workers=2, use_multiprocessing=True)" in workers["code"]
    assert "Photos.__init__` (train.py:24)" in workers["text"]
    text = " ".join(o["text"] + (o["code"] or "") for o in f["fix"]["options"])
    assert "tf." not in text and "tf.data" not in text
    assert f["fix"]["docs"] == [rules_keras.DOCS_PYDATASET]


def test_without_decoding_the_workers_are_the_fix_and_a_class_without_kwargs_gets_its_super_call():
    f = rules_keras.input_bound(backend_facts("torch", decode=0.05, trainer_cores=0.5,
                                              fit={"input_kwargs": False}))
    assert "worker processes" in f["fix"]["text"]
    assert f["est_speedup"] == pytest.approx(0.06 / (0.048 / 2), rel=1e-3)  # the loading, over 2 processes
    assert "super().__init__(workers=2, use_multiprocessing=True)   # was workers=1" in f["fix"]["code"]
    assert not any("Decode once" in o["text"] for o in f["fix"]["options"])
    # 5 MB batches: Keras pickles each one through a pipe (14 ms here), which the workers cannot hide
    big = rules_keras.input_bound(backend_facts("torch", decode=0.05, trainer_cores=0.5, fit={"batch_bytes": 5 << 20}))
    handover = 5 * 2.8e-3
    assert big["evidence"]["handover_s_per_batch"] == pytest.approx(handover, rel=1e-3)
    workers = next(o for o in big["fix"]["options"] if "worker processes" in o["text"])
    assert workers["est_speedup"] == pytest.approx(0.06 / ((0.048 + handover) / 2), rel=1e-3)


def test_on_jax_the_cache_gain_is_the_slower_of_computation_and_loop_and_workers_are_threads():
    # the computation (11.4 ms a step) runs beside the loop: keeping the decoded arrays leaves the loop
    # 24.6 ms of its own a step (on torch, one after the other: 36 ms)
    f = rules_keras.input_bound(backend_facts("jax", data_share=0.8, compute=0.19, decode=0.5))
    mean, comp, decode = 0.06, 0.19 * 0.06, 0.5 * 0.8 * 0.06
    assert f["est_speedup"] == pytest.approx(mean / (mean - comp - decode), rel=1e-3)
    torch = rules_keras.input_bound(backend_facts("torch", data_share=0.8, compute=0.19, decode=0.5))
    cache = next(o for o in torch["fix"]["options"] if "Decode once" in o["text"])
    assert cache["est_speedup"] == pytest.approx(mean / (mean - decode), rel=1e-3)
    workers = next(o for o in f["fix"]["options"] if "worker threads" in o["text"])
    assert workers["assumed"] and "use_multiprocessing" not in workers["code"] and "fork" in workers["condition"]


def test_workers_that_cannot_keep_up_and_a_torch_dataloader():
    few = rules_keras.input_bound(backend_facts("torch", decode=None, fit={"workers": 2, "use_multiprocessing": True},
                                                **{"host": {"cores": 8, "cpu_busy_share": 0.5}}))
    assert few["evidence"]["workers_now"] == 2 and "built in 2 workers the step still waits for" in few["summary"]
    assert few["evidence"]["suggested_workers"] > 2
    loader = rules_keras.input_bound(backend_facts("torch", decode=None, fit={"input": "torch DataLoader", "workers": 0}))
    assert loader["evidence"]["cause"] == "loader_in_main_process"
    assert "num_workers=2, persistent_workers=True" in loader["fix"]["code"]


def test_no_tensorflow_advice_to_keras_on_torch_or_jax():
    from whyidle.diagnose import fixes, rules, rules_batch

    for backend in ("torch", "jax"):
        f = backend_facts(backend, data_share=0.02)
        f.step["batch_size"] = 8
        f.step["shares"].update(other_host=0.4, compute=0.58)
        host = rules.host_bound(f)
        assert "tf.function" not in host["fix"]["text"] and "steps_per_execution" in host["fix"]["text"]
        small = rules_batch.small_batch(f)
        assert "ds.batch" not in (small["fix"]["code"] or "") and "PyDataset" in small["fix"]["code"]
        assert "XLA" not in fixes.keras_jit_text(f)
        gpu = backend_facts(backend, tf_devices={"physical_gpus": 0, "is_cuda_build": False, "tf_version": "2.21.0"},
                            gpu_static={"devices": [{"index": 0, "cuda_driver_version": "12.2"}]})
        assert rules_keras.gpu_not_visible(gpu) is None  # TensorFlow's GPUs are not the job's
        arrays = rules_keras.input_bound(backend_facts(backend, fit={"input": "numpy"}))
        assert "tf.data" not in arrays["fix"]["text"]
    tf_run = facts(data_share=0.02)
    tf_run.step["shares"].update(other_host=0.4)
    assert "tf.function" in rules.host_bound(tf_run)["fix"]["text"]  # Keras on TensorFlow keeps its terms
