"""Training frameworks on top of PyTorch: Lightning, the Hugging Face ``Trainer``, Accelerate.

Installed by the agent's post-import hooks when the program imports ``lightning`` /
``pytorch_lightning``, ``transformers.trainer`` or ``accelerate``. Each framework's public entry
points are wrapped to write one ``api`` record per call, *before* the call runs: which framework
drives training, its version, the user's line that called it, and the settings a fix is written in
(Lightning ``Trainer`` flags, ``TrainingArguments``, ``Accelerator`` options). Nothing else changes:
the wrappers call the original with the same arguments and return what it returns.

- Lightning: ``Trainer.fit`` / ``validate`` / ``test`` / ``predict``.
- Hugging Face: ``transformers.Trainer.train`` / ``evaluate`` / ``predict`` (subclasses such as
  ``Seq2SeqTrainer`` inherit them).
- Accelerate: ``Accelerator.__init__`` (recorded after it returns, from the instance's own
  attributes). The HF ``Trainer`` builds an ``Accelerator`` too; the analysis ranks the frameworks
  (:data:`whyidle.analysis.api.API_ORDER`).

The step phases come from the PyTorch hooks (:mod:`whyidle.instrument.torch`): Lightning's
``training_step`` and backward run inside ``optimizer.step(closure)``, whose closure the optimizer
pre-hook times as host work; the HF ``Trainer`` and Accelerate call ``loss.backward()`` and
``optimizer.step()`` themselves. The ``site`` of an entry call lets the analysis tell the
framework's own work (a sample whose innermost user frame is the ``trainer.fit(...)`` line) from the
user's code that the framework calls (``training_step``, callbacks).
"""

from __future__ import annotations

import functools
import sys
from time import monotonic_ns

from whyidle.instrument import patches, regions, startup

#: Settings read from a Lightning ``Trainer`` (attribute names of its public API).
LIGHTNING_TRAINER_ATTRS = ("accumulate_grad_batches", "log_every_n_steps", "precision", "val_check_interval",
                           "check_val_every_n_epoch", "num_sanity_val_steps", "max_epochs", "max_steps",
                           "num_devices", "limit_val_batches")
#: ``TrainingArguments`` fields a fix may name (transformers ≥ 4.40 spellings).
HF_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
           "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
           "logging_steps", "logging_strategy", "eval_strategy", "eval_steps", "save_strategy", "save_steps",
           "bf16", "fp16", "tf32", "torch_compile", "use_cpu", "disable_tqdm", "report_to")

_installed: set[str] = set()


def _plain(value):
    """A JSON-safe copy of a setting: numbers, strings, bools and None as they are, lists of them,
    enums by value, anything else as its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value[:16]]
    inner = getattr(value, "value", None)  # enums (IntervalStrategy.STEPS → "steps")
    if isinstance(inner, (int, float, str)):
        return inner
    return str(value)


def _torch_instrument():
    """The process's PyTorch instrumentation (every framework here imports torch first), or None."""
    from whyidle.instrument import torch as torch_instrument

    return torch_instrument._INSTANCE


def _method_site(obj, name: str) -> str | None:
    """``"file:line method"`` of ``obj``'s ``name`` method when the program defines it (not the
    framework's default), else None."""
    code = getattr(getattr(type(obj), name, None), "__code__", None)
    inst = _torch_instrument()
    if code is None or inst is None:
        return None
    kind, label = inst.frames().classify(code.co_filename)
    return f"{label}:{code.co_firstlineno} {name}" if kind == 0 else None


def _caller_site(depth: int = 2) -> str | None:
    """The innermost user frame (``"file:line function"``) of the code that called the wrapped
    entry point, or None."""
    try:
        inst = _torch_instrument()
        return None if inst is None else inst.site_of(sys._getframe(depth))[0]
    except Exception:
        return None


def _wrap(cls, method: str, agent, make_record, after: bool = False) -> None:
    """Replaces ``cls.method`` by a wrapper that writes ``make_record(self, args, kwargs)`` (plus
    ``t``, ``entry``, ``site``) before the call (``after``: once it returned), then calls the original.
    Recording errors turn into one notice; the call itself is never changed."""
    orig = getattr(cls, method, None)
    if orig is None or getattr(orig, "__whyidle_wrapped__", False):
        return
    entry = f"{cls.__name__}.{method}"

    def note(self, args, kwargs, site):
        if agent.disabled:
            return
        try:
            rec = make_record(self, args, kwargs)
            rec.update(k="api", t=monotonic_ns(), entry=entry, site=site)
            agent.record(rec)
        except Exception as exc:
            agent.notice(f"{entry} settings not recorded: {exc!r}")

    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        __tracebackhide__ = True  # IPython and pytest leave whyidle's frame out of the program's tracebacks
        site = _caller_site()
        if not after:
            note(self, args, kwargs, site)
            startup.entered(agent)  # until its first step, the framework's own start
            return orig(self, *args, **kwargs)
        out = orig(self, *args, **kwargs)
        note(self, args, kwargs, site)
        return out

    wrapper.__whyidle_wrapped__ = True
    patches.assign(cls, method, wrapper)


def _compiled(model) -> bool:
    """True for a ``torch.compile``d module (``OptimizedModule`` keeps the original in ``_orig_mod``)."""
    return hasattr(model, "_orig_mod")


def _lightning_record(version: str, name: str):
    def make(trainer, args, kwargs) -> dict:
        config = {a: _plain(getattr(trainer, a, None)) for a in LIGHTNING_TRAINER_ATTRS}
        bar = getattr(trainer, "progress_bar_callback", None)
        config["progress_bar"] = None if bar is None else {
            "class": type(bar).__name__, "refresh_rate": _plain(getattr(bar, "refresh_rate", None))}
        config["callbacks"] = [type(c).__name__ for c in (getattr(trainer, "callbacks", None) or [])][:32]
        config["accelerator"] = type(getattr(trainer, "accelerator", None)).__name__
        model = args[0] if args else kwargs.get("model")
        datamodule = kwargs.get("datamodule")
        if datamodule is None and len(args) > 1 and hasattr(args[1], "train_dataloader") \
                and not hasattr(args[1], "training_step"):
            datamodule = args[1]  # fit(model, datamodule) passed by position
        config["model"] = type(model).__name__ if model is not None else None
        config["compiled"] = _compiled(model) if model is not None else None
        config["datamodule"] = type(datamodule).__name__ if datamodule is not None else None
        owner = datamodule if datamodule is not None else getattr(model, "_orig_mod", model)
        config["train_dataloader"] = _method_site(owner, "train_dataloader") if owner is not None else None
        return {"name": "lightning", "package": name, "version": version, "config": config}

    return make


def install_lightning(agent, module) -> None:
    """Wraps ``Trainer.fit``/``validate``/``test``/``predict`` of ``lightning`` (``module.pytorch``)
    or ``pytorch_lightning`` (once per package)."""
    name = module.__name__
    if name in _installed:
        return
    _installed.add(name)
    pkg = getattr(module, "pytorch", module)  # lightning.pytorch / pytorch_lightning
    trainer = getattr(pkg, "Trainer", None)
    if trainer is None:
        return
    make = _lightning_record(str(getattr(module, "__version__", None)), name)
    for method in ("fit", "validate", "test", "predict"):
        _wrap(trainer, method, agent, make)
    regions.wrap(trainer, "save_checkpoint", "checkpoint", agent, "Trainer.save_checkpoint")
    # the validation / test loop (sanity check, validation during fit, validate, test): Lightning
    # restores the modules' training flags by assignment, so model.eval() alone cannot time it
    loop = getattr(sys.modules.get(pkg.__name__ + ".loops.evaluation_loop"), "_EvaluationLoop", None)
    if loop is not None:
        regions.wrap(loop, "run", "evaluation", agent, "EvaluationLoop.run")


def _hf_record(version: str):
    def make(trainer, args, kwargs) -> dict:
        targs = getattr(trainer, "args", None)
        config = {a: _plain(getattr(targs, a, None)) for a in HF_ARGS}
        handler = getattr(trainer, "callback_handler", None)
        config["callbacks"] = [type(c).__name__ for c in (getattr(handler, "callbacks", None) or [])][:32]
        model = getattr(trainer, "model", None)
        config["model"] = type(model).__name__ if model is not None else None
        config["compiled"] = _compiled(model) if model is not None else None
        config["trainer_class"] = type(trainer).__name__
        return {"name": "hf_trainer", "package": "transformers", "version": version, "config": config}

    return make


def install_transformers_trainer(agent, module) -> None:
    """Wraps ``Trainer.train``/``evaluate``/``predict`` of ``transformers.trainer`` (once)."""
    if "transformers" in _installed:
        return
    _installed.add("transformers")
    trainer = getattr(module, "Trainer", None)
    if trainer is None:
        return
    version = str(getattr(sys.modules.get("transformers"), "__version__", None))
    make = _hf_record(version)
    for method in ("train", "evaluate", "predict"):
        _wrap(trainer, method, agent, make)
    for method in ("evaluate", "predict"):
        regions.wrap(trainer, method, "evaluation", agent, f"Trainer.{method}")
    regions.wrap(trainer, "_save_checkpoint", "checkpoint", agent, "Trainer._save_checkpoint")


def _accelerate_record(version: str):
    def make(acc, args, kwargs) -> dict:
        dl = getattr(acc, "dataloader_config", None)
        dynamo = getattr(getattr(acc, "state", None), "dynamo_plugin", None)
        config = {
            "mixed_precision": _plain(getattr(acc, "mixed_precision", None)),
            "gradient_accumulation_steps": _plain(getattr(acc, "gradient_accumulation_steps", None)),
            "device": _plain(getattr(acc, "device", None)),
            "num_processes": _plain(getattr(acc, "num_processes", None)),
            "non_blocking": _plain(getattr(dl, "non_blocking", None)),
            "dynamo_backend": _plain(getattr(dynamo, "backend", None)),
        }
        return {"name": "accelerate", "package": "accelerate", "version": version, "config": config}

    return make


def install_accelerate(agent, module) -> None:
    """Wraps ``Accelerator.__init__`` of ``accelerate`` (once); the record is written when it returns."""
    if "accelerate" in _installed:
        return
    _installed.add("accelerate")
    acc = getattr(module, "Accelerator", None)
    if acc is None:
        return
    _wrap(acc, "__init__", agent, _accelerate_record(str(getattr(module, "__version__", None))), after=True)


#: Experiment trackers' logging calls, timed as ``logging`` regions: module → (owner path, names).
#: wandb rebinds ``wandb.log`` to the run's method at ``wandb.init``: the method is wrapped.
LOGGING_CALLS = {
    "torch.utils.tensorboard": ("SummaryWriter", ("add_scalar", "add_scalars", "add_histogram", "add_image",
                                                  "add_images", "add_figure", "add_text", "add_embedding",
                                                  "add_graph", "flush")),
    "wandb": ("sdk.wandb_run.Run", ("log", "save")),
    "mlflow": ("", ("log_metric", "log_metrics", "log_param", "log_params", "log_artifact", "log_artifacts",
                    "log_figure", "log_image", "log_dict", "log_text")),
}
#: Checkpoint writers outside the training frameworks: module → (owner path, names).
CHECKPOINT_CALLS = {
    "safetensors.torch": ("", ("save_file", "save_model")),
    "transformers.modeling_utils": ("PreTrainedModel", ("save_pretrained",)),
}


def _owner(module, path: str):
    obj = module
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def install_regions(agent, module) -> None:
    """Times a tracker's logging calls or a library's checkpoint writers (``LOGGING_CALLS``,
    ``CHECKPOINT_CALLS``) as regions (:mod:`whyidle.instrument.regions`)."""
    for table, kind in ((LOGGING_CALLS, "logging"), (CHECKPOINT_CALLS, "checkpoint")):
        spec = table.get(module.__name__)
        if spec is None:
            continue
        owner = _owner(module, spec[0])
        if owner is None:
            return
        prefix = spec[0].rsplit(".", 1)[-1] or module.__name__
        for name in spec[1]:
            regions.wrap(owner, name, kind, agent, f"{prefix}.{name}")
