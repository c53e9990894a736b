"""The winning trial's settings as the code change to make, in the program's own API (pure).

The baseline run's facts say how the program builds its loader (its ``DataLoader(...)`` line and
argument texts, Lightning's ``train_dataloader`` hook, the HF ``TrainingArguments``, a tf.data
pipeline or ``Model.fit``); the winner's ``override`` records say at which lines the settings
took effect.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes, notebook
from whyidle.diagnose.loader_call import Change

#: HF ``TrainingArguments`` field of each DataLoader setting.
HF_FIELDS = {"num_workers": "dataloader_num_workers", "persistent_workers": "dataloader_persistent_workers",
             "prefetch_factor": "dataloader_prefetch_factor", "pin_memory": "dataloader_pin_memory",
             "batch_size": "per_device_train_batch_size"}
LOADER = ("batch_size", "num_workers", "persistent_workers", "prefetch_factor", "pin_memory")


def _was(value, old) -> str:
    return f"   # was {old}" if old is not None and old != value else ""


def settings_code(facts: RunFacts, settings: dict, sites: dict[str, str] | None = None) -> str:
    """The code change for ``settings`` (knob → value, :data:`whyidle.instrument.overrides.KNOBS`).

    Args:
        facts: the baseline run's facts (its loader, API and tf.data pipeline).
        settings: the winning trial's settings.
        sites: knob → ``file:line`` where the trial applied it (from its ``override`` records).
    Returns: lines of code, each change marked with the program's value it replaces; in a notebook
    also the lines of :func:`whyidle.diagnose.notebook.worker_notes` (a cell's Dataset moved to a
    module for spawn workers, the loader's own cell, the kernel's threads set back).
    """
    sites = sites or {}
    name = fixes.api_name(facts)
    lines: list[str] = []
    if "threads" in settings:
        lines.append(f"torch.set_num_threads({settings['threads']}){_was(settings['threads'], (facts.proc or {}).get('threads'))}")
    if settings.get("tf32"):
        lines.append('torch.set_float32_matmul_precision("high")   # float32 matmuls on TF32 tensor cores')
    if "cudnn_benchmark" in settings:
        lines.append(f"torch.backends.cudnn.benchmark = {settings['cudnn_benchmark']}")
    knobs = {k: settings[k] for k in LOADER if k in settings}
    if knobs and name in ("keras", "tensorflow"):
        lines += _tf_batch(facts, knobs["batch_size"]) if "batch_size" in knobs else []
    elif knobs and name == "hf_trainer":
        cfg = (facts.api or {}).get("config") or {}
        lines.append("args = TrainingArguments(")
        lines.append("    ...,")
        for k, v in knobs.items():
            lines.append(f"    {HF_FIELDS[k]}={v},{_was(v, cfg.get(HF_FIELDS[k]))}")
        lines.append(")")
    elif knobs:
        lines += _loader_lines(facts, knobs, sites)
    lines += _frequency_lines(facts, settings)
    if settings.get("autocast") == "off":
        lines.append("with torch.autocast(..., enabled=False):   # float32: the emulated 16-bit type measured slower")
    elif "autocast" in settings:
        bf16 = settings["autocast"] == "bf16"
        api = fixes.mixed_precision_code(facts, bf16)
        dtype = "torch.bfloat16" if bf16 else "torch.float16"
        device = (facts.device or {}).get("kind") or "cuda"
        lines += [api[1]] if api else [f'with torch.autocast("{device}", dtype={dtype}):   # forward and loss',
                                       "    loss = loss_fn(model(x), y)",
                                       "loss.backward()   # outside autocast"
                                       + ("" if bf16 else "; float16 needs torch.amp.GradScaler")]
    if settings.get("tfdata_parallel_map") or settings.get("tfdata_prefetch"):
        lines += _tfdata_lines(facts, settings, sites)
    code = "\n".join(lines)
    if facts.notebook and code:  # a notebook: spawn workers import a cell's Dataset; threads outlive the cell
        workers = settings.get("num_workers") if isinstance(settings.get("num_workers"), int) else 0
        notes = notebook.worker_notes(facts, workers, threads="threads" in settings,
                                      persistent=bool(settings.get("persistent_workers")))
        code = notebook.with_notes("", code, notes)[1]
    return code


#: Where each frequency setting is passed, per call (:data:`whyidle.instrument.overrides.FREQUENCY_KNOBS`).
FREQUENCY_CALLS = (("trainer = Trainer(", ("val_check_interval", "check_val_every_n_epoch", "limit_val_batches",
                                           "log_every_n_steps")),
                   ("ModelCheckpoint(", ("every_n_train_steps",)),
                   ("args = TrainingArguments(", ("eval_steps", "save_steps", "logging_steps")),
                   ("model.fit(", ("validation_freq",)))


def _frequency_lines(facts: RunFacts, settings: dict) -> list[str]:
    """How often the framework evaluates, saves and logs, as the arguments of the call that takes
    them, each marked with the program's value (the recorded ``Trainer`` flags / ``TrainingArguments``)."""
    cfg = (facts.api or {}).get("config") or {}
    out = []
    for head, knobs in FREQUENCY_CALLS:
        given = [k for k in knobs if k in settings]
        if given:
            args = ", ".join(f"{k}={settings[k]!r}" for k in given)
            was = "; ".join(f"{k} was {cfg[k]!r}" for k in given if cfg.get(k) is not None and cfg[k] != settings[k])
            out.append(f"{head}..., {args})" + (f"   # {was}" if was else ""))
    return out


def _tfdata_lines(facts: RunFacts, settings: dict, sites: dict) -> list[str]:
    """The tf.data stages to change, written as the stages of the pipeline's chain (where they
    stand, ``ds = ds.map(...)`` or inside ``Dataset...map(...).batch(...)``), not as new
    statements: a ``map`` added after ``batch`` would map whole batches."""
    out = []
    if settings.get("tfdata_parallel_map"):
        fns = [s.get("fn") or "fn" for s in (facts.tfdata or {}).get("stages") or []
               if s.get("op") == "map" and s.get("parallel") is None] or ["fn"]
        where = sites.get("tfdata_parallel_map")
        out.append(f"# the pipeline{' at ' + where if where else ''}: each map stage where it stands")
        out += [f"    .map({fn}, num_parallel_calls=tf.data.AUTOTUNE)" for fn in dict.fromkeys(fns)]
    if settings.get("tfdata_prefetch"):
        out.append("# its last stage, before model.fit(ds):")
        out.append("    .prefetch(tf.data.AUTOTUNE)")
    return out


def _loader_lines(facts: RunFacts, knobs: dict, sites: dict) -> list[str]:
    """The program's ``DataLoader(...)`` statement with the winner's settings
    (:func:`whyidle.diagnose.fixes.loader_lines`: built from the call as written, to paste over it),
    under Lightning in its ``train_dataloader`` hook."""
    loader = facts.loader or {}
    changes = [Change(k, repr(v), now=loader.get(k) or (0 if k == "num_workers" else loader.get(k)),
                      off={"persistent_workers": "False", "prefetch_factor": "None"}.get(k))
               for k, v in knobs.items()]
    where = sites.get("num_workers") or sites.get("batch_size")
    out = fixes.in_api(facts, fixes.loader_lines(facts, changes, where), tail=False)
    if "batch_size" in knobs:
        out.append(f"# batch_size was {loader.get('batch_size')}: re-validate the learning rate and convergence "
                   "(the linear-scaling rule is a hint, not a promise)")
    return out


def _tf_batch(facts: RunFacts, size: int) -> list[str]:
    """The batch size of a Keras/TensorFlow program: ``.batch(n)`` of its tf.data pipeline, else
    ``Model.fit(batch_size=n)``."""
    if facts.tfdata:
        return [f"ds = ds.batch({size})   # was {(facts.tfdata or {}).get('batch_size')}"]
    return [f"model.fit(x, y, batch_size={size}, ...)"]
