"""Fixes for a Python input that Keras's ``fit`` draws its batches from (pure; no framework imports).

On the torch and JAX backends whyidle times each batch the trainer takes from its input
(``input_wait.method == "fit_input"``). When ``fit`` was given a ``keras.utils.PyDataset``, a
Python generator or a torch ``DataLoader``, the batch is built by the program's Python: in the
training thread itself (a ``PyDataset`` with the default ``workers=1``, a generator, a
``DataLoader`` with ``num_workers=0``), or in workers the step still waits for. Two fixes, each
estimated on this machine (:func:`options`):

- **workers** — ``PyDataset(workers=k, use_multiprocessing=True)`` (``DataLoader(num_workers=k)``;
  a generator becomes a ``PyDataset``): loading runs beside the step, ``max_queue_size`` batches
  ahead. Model (:func:`workers_model`): one batch takes ``L`` of loading (the wait itself when the
  training thread builds it; ``n × step`` when ``n`` workers already cannot keep up) and, between
  processes, ``h`` to hand over (the batch's bytes × ``PYDATASET_IPC_S_PER_BYTE``: Keras pickles
  it through a pipe); with ``k`` workers the step takes max(rest of the step, (L + h) / k, h, the
  CPU per step (the process's and its workers', plus ``h``) spread over the cores at
  ``CPU_PARALLEL_EFFICIENCY``). On JAX the workers are threads (``fork`` of a JAX process can
  deadlock; no hand-over), which overlap only work that releases the GIL: that estimate is
  ``assumed``.
- **cache decoded data** — decode once, keep the decoded arrays, augment per batch: removes the
  part of the wait the stack samples spent decoding images (``RunFacts.data_decode_share``, when
  at least :data:`DECODE_MIN_SHARE` and the training thread builds the batches): the step becomes
  ``step − decode share × wait`` (at least the compute share), and on JAX, whose computation runs
  beside the loop, the larger of the compute and the loop's remaining host work.

Source of the API: ``keras.utils.PyDataset`` (Keras 3: ``workers``, ``use_multiprocessing``,
``max_queue_size`` in ``__init__``), ``keras/src/trainers/data_adapters/py_dataset_adapter.py``
(worker pool only when ``workers > 1`` or ``use_multiprocessing``).
"""

from __future__ import annotations

import math

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes, notebook
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.fixes import keras_fit_call as fit_call
from whyidle.diagnose.rules import fix_option, usable_cores, whole_cores
from whyidle.diagnose.types import FixOption

#: Decoding must hold at least this fraction of the sampled loading time before caching the
#: decoded data is offered with an estimate: below a fifth the cache gains less than the noise of
#: the estimate (the share comes from ~100 stack samples a second) and the workers fix is the one.
DECODE_MIN_SHARE = 0.2
#: Inputs whose batches the program's Python builds.
PYTHON_INPUTS = ("PyDataset", "generator", "torch DataLoader")


def current_workers(call: dict) -> int:
    """Workers that build batches beside the step today: 0 when the training thread builds them
    (a generator, a ``PyDataset`` with ``workers=1`` without multiprocessing, a ``DataLoader``
    with ``num_workers=0``)."""
    kind, n = call.get("input"), call.get("workers") or 0
    if kind == "PyDataset":
        return n if (n > 1 or (n > 0 and call.get("use_multiprocessing"))) else 0
    return n if kind == "torch DataLoader" else 0


def workers_model(facts: RunFacts, threads: bool = False) -> dict:
    """What ``k`` workers would give (module docstring), seconds per step: ``now`` (workers
    today), ``loading_s`` (L: loading per batch), ``handover_s`` (h; 0 for ``threads`` and for a
    torch ``DataLoader``, whose workers share memory), ``rest_s``, ``floor_s`` (the CPU per step
    over the usable cores × ``CPU_PARALLEL_EFFICIENCY``), ``workers`` (k = ⌈L / rest⌉ ×
    ``WORKER_HEADROOM``, at least ``now + 1``, at most the usable cores), ``predicted_step_s``,
    ``est_speedup`` (today's mean step ÷ predicted)."""
    step, host, call = facts.step, facts.host or {}, fit_call(facts)
    mean = step["step_time_s"]["mean"]
    wait = step["data_wait_s_per_step"]
    rest = max(mean - wait, 1e-6)
    now = current_workers(call)
    loading = wait if now == 0 else now * mean
    need = math.ceil(loading / rest * T.WORKER_HEADROOM)
    k = max(now + 1, min(whole_cores(host), need))
    pickled = not threads and call.get("input") != "torch DataLoader"
    handover = (call.get("batch_bytes") or 0) * T.PYDATASET_IPC_S_PER_BYTE if pickled else 0.0
    cpu = ((host.get("trainer_cores") or 0.0) + (host.get("workers_cores") or 0.0)) * mean + handover
    floor = cpu / (usable_cores(host) * T.CPU_PARALLEL_EFFICIENCY)
    predicted = min(mean, max(rest, (loading + handover) / k, handover, floor))
    return {"now": now, "loading_s": loading, "handover_s": handover, "rest_s": rest, "floor_s": floor, "workers": k,
            "predicted_step_s": predicted, "est_speedup": mean / predicted}


def _where(call: dict) -> str:
    cls, init = call.get("input_class"), call.get("input_init")
    return f"`{cls}.__init__` ({init})" if cls and init else (f"`{cls}`" if cls else "your PyDataset")


def _workers_option(facts: RunFacts, removed: float, threads: bool) -> tuple[FixOption, dict]:
    call = fit_call(facts)
    kind = call.get("input")
    m = workers_model(facts, threads)
    k = m["workers"]
    est = min(m["est_speedup"], removed)
    procs = "threads" if threads else "processes"
    mp = "" if threads else ", use_multiprocessing=True"
    queue = call.get("max_queue_size") or 10
    if kind == "torch DataLoader":
        text = (f"Prepare the batches in {k} DataLoader worker processes (num_workers={k}, persistent_workers=True) "
                f"so loading overlaps the train step; about {est:.2f}× per step.")
        code = f"loader = DataLoader(..., num_workers={k}, persistent_workers=True)   # was num_workers={m['now']}"
        text, code = notebook.with_notes(text, code, notebook.worker_notes(facts, k))  # nothing outside a notebook
    elif kind == "PyDataset":
        was = f"workers={call.get('workers')}" + (", use_multiprocessing=True" if call.get("use_multiprocessing") else "")
        text = (f"Build the batches in {k} worker {procs}: PyDataset(workers={k}{mp}) in {_where(call)}; Keras then "
                f"keeps up to max_queue_size={queue} batches ready while the step runs; about {est:.2f}× per step.")
        cls = call.get("input_class") or "Batches"
        if call.get("input_kwargs"):
            code = (f"{cls}(..., workers={k}{mp})   # where fit's input is built; was {was}\n"
                    f"# {cls}.__init__ passes **kwargs on to keras.utils.PyDataset")
        else:
            code = (f"class {cls}(keras.utils.PyDataset):\n    def __init__(self, ...):\n"
                    f"        super().__init__(workers={k}{mp})   # was {was}")
    else:  # a generator: one thread, one batch at a time
        text = (f"Build the batches in {k} worker {procs}: a keras.utils.PyDataset whose __getitem__ makes batch i "
                f"(the body of your generator's loop), with workers={k}{mp}; about {est:.2f}× per step.")
        code = ("class Batches(keras.utils.PyDataset):\n"
                f"    def __init__(self):\n        super().__init__(workers={k}{mp})\n"
                "    def __len__(self):\n        return steps_per_epoch\n"
                "    def __getitem__(self, i):\n        return make_batch(i)      # the body of your generator's loop\n\n"
                "model.fit(Batches(), epochs=epochs)")
    condition = None
    if threads:
        condition = ("if the loading releases the GIL (numpy, image decoding): a JAX process must not fork, so its "
                     "PyDataset workers are threads")
    elif k >= whole_cores(facts.host or {}) and m["loading_s"] / k > m["rest_s"]:
        condition = f"more with more cores ({k} workers fill the {whole_cores(facts.host or {})} here)"
    opt = fix_option(text, est, condition, code, assumed=threads)
    return opt, m


def _cache_option(facts: RunFacts, removed: float) -> tuple[FixOption, float] | None:
    share = facts.data_decode_share
    call = fit_call(facts)
    if share is None or share < DECODE_MIN_SHARE or current_workers(call):
        return None
    step = facts.step
    mean, wait = step["step_time_s"]["mean"], step["data_wait_s_per_step"]
    decode_s = share * wait
    comp = (step["shares"].get("compute") or 0.0) * mean
    if fixes.keras_backend(facts) == "jax":  # the computation runs beside the loop: the slower of the two
        predicted = max(comp, mean - comp - decode_s)
    else:  # one after the other
        predicted = max(comp, mean - decode_s)
    est = min(mean / max(predicted, 1e-9), removed)
    kind = call.get("input")
    text = (f"Decode once and keep the decoded arrays: {share:.0%} of the loading time ({decode_s * 1e3:.1f} ms per "
            "step) is decoding the same images again every epoch; decode them when the input is built (or into a "
            ".npy file read with np.load(mmap_mode='r'): they must fit in memory or on disk) and keep only the random "
            f"augmentation per batch, after the cache; about {est:.2f}× per step.")
    cls = call.get("input_class") or "Batches"
    if kind == "PyDataset":
        code = (f"class {cls}(keras.utils.PyDataset):\n"
                "    def __init__(self, files, labels, **kwargs):\n"
                "        super().__init__(**kwargs)\n"
                "        self.images = np.stack([decode(f) for f in files])   # once: uint8 (N, H, W, C) in memory\n"
                "        self.labels = labels\n"
                "    def __getitem__(self, i):\n"
                "        idx = slice(i * BATCH, (i + 1) * BATCH)\n"
                "        return augment(self.images[idx]), self.labels[idx]   # no decoding per batch")
    else:
        code = ("images = np.stack([decode(f) for f in files])   # once, before training: uint8 (N, H, W, C)\n"
                "# per batch: augment(images[idx]) instead of decoding the files again")
    return fix_option(text, est, None, code), decode_s


def options(facts: RunFacts, removed: float) -> tuple[list[FixOption], dict]:
    """The fix options for a Python input (module docstring) and the evidence they rest on:
    ``workers_now``, ``suggested_workers``, ``loading_s_per_batch``, ``handover_s_per_batch``, ``cpu_floor_s``,
    ``predicted_step_s`` (workers), ``decode_share``, ``decode_s_per_step``. ``removed`` caps every
    estimate (1 / (1 − data-wait share)). Unranked."""
    threads = fixes.keras_backend(facts) == "jax" and fit_call(facts).get("input") != "torch DataLoader"
    workers, m = _workers_option(facts, removed, threads)
    out = [workers]
    evidence = {"workers_now": m["now"], "suggested_workers": m["workers"], "loading_s_per_batch": m["loading_s"],
                "handover_s_per_batch": m["handover_s"],
                "cpu_floor_s": m["floor_s"], "predicted_step_s": m["predicted_step_s"],
                "decode_share": facts.data_decode_share, "decode_s_per_step": None}
    cache = _cache_option(facts, removed)
    if cache is not None:
        out.append(cache[0])
        evidence["decode_s_per_step"] = cache[1]
    return out, evidence
