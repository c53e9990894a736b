"""What-if settings applied inside the user's program for a ``whyidle tune`` trial.

``whyidle tune`` runs the unchanged command with ``WHYIDLE_OVERRIDES`` set to a JSON object of
settings (:data:`KNOBS`); the agent applies them where the program makes the choice, without any
change to its files:

- ``DataLoader(...)``: ``num_workers``, ``pin_memory``, ``persistent_workers``,
  ``prefetch_factor``, ``batch_size`` replace the program's arguments (the DataLoader's own
  ``__init__`` is wrapped, so Lightning, the HF ``Trainer`` and Accelerate, which build
  DataLoaders, take them too);
- ``threads``: ``torch.set_num_threads`` once in the training process; ``cudnn_benchmark``,
  ``tf32`` (``torch.set_float32_matmul_precision("high")``); ``autocast`` (``"bf16"`` or
  ``"fp16"``): the outermost module call of each forward runs under ``torch.autocast``;
- ``autocast="off"``: the program's own ``torch.autocast`` regions (and those of the framework that
  runs it) are entered with ``enabled=False``: the model runs in float32;
- how often the framework evaluates, saves and logs: Lightning ``Trainer(...)``
  (``val_check_interval``, ``check_val_every_n_epoch``, ``limit_val_batches``,
  ``log_every_n_steps``) and ``ModelCheckpoint(every_n_train_steps=...)``, HF
  ``TrainingArguments(...)`` (``eval_steps``, ``save_steps``, ``logging_steps``), Keras
  ``Model.fit(validation_freq=...)``: the program's arguments replaced where it passes them;
- ``replay`` (N): each DataLoader keeps the first N batches it yields and then hands out only
  those (:mod:`whyidle.instrument.replay`): the step with an ideal loader;
- ``compile_dynamic``: every ``torch.compile(...)`` (and ``Module.compile()``) call gets
  ``dynamic=True``: one compilation with symbolic sizes instead of a recompilation per new size;
- tf.data: ``tfdata_parallel_map`` (``map`` without ``num_parallel_calls`` gets
  ``tf.data.AUTOTUNE``), ``tfdata_prefetch`` (the dataset given to ``Model.fit`` gets
  ``.prefetch(tf.data.AUTOTUNE)``), ``batch_size`` (``Dataset.batch(n)`` and ``Model.fit(batch_size=)``).

In a trial, checkpoint writers (``torch.save``, safetensors, ``save_pretrained``, Lightning,
Keras: the ``checkpoint`` regions of :mod:`whyidle.instrument.regions`) write under the trial's
scratch folder (:data:`SCRATCH_ENV`) instead of the program's paths, and ``torch.load`` reads a
file the trial saved from there.

Each application, and each one that cannot apply (a ``batch_sampler`` fixes the batches, the
dataset is smaller than the batch, a setting nothing in the program used), is one ``override``
record (docs/run-format.md): never silently ignored. Processes started by :mod:`multiprocessing`
(DataLoader workers) take none: they are not where the program chooses its settings.
Standard library only, beside the frameworks the program imported itself.
"""

from __future__ import annotations

import json
import os
import sys
import time

#: Environment variable holding the trial's settings (a JSON object).
ENV = "WHYIDLE_OVERRIDES"
#: Environment variable naming the folder a trial's checkpoints are written to instead of where
#: the program saves them (:meth:`Overrides.redirect`), so trials never overwrite the program's own.
SCRATCH_ENV = "WHYIDLE_SCRATCH"

#: Settings a trial may override, with the Python type each takes.
KNOBS = {
    "num_workers": int, "pin_memory": bool, "persistent_workers": bool, "prefetch_factor": int,
    "batch_size": int, "threads": int, "cudnn_benchmark": bool, "tf32": bool, "autocast": str,
    "tfdata_parallel_map": bool, "tfdata_prefetch": bool, "compile_dynamic": bool,
    # how often the framework evaluates, saves and logs (:data:`FREQUENCY_KNOBS`)
    "val_check_interval": (int, float), "check_val_every_n_epoch": int, "limit_val_batches": (int, float),
    "eval_steps": int, "validation_freq": int, "every_n_train_steps": int, "save_steps": int,
    "log_every_n_steps": int, "logging_steps": int,
    # the input pipeline's ceiling: the first N batches of each DataLoader replayed (:mod:`whyidle.instrument.replay`)
    "replay": int,
}
#: Framework settings of how often the job evaluates, saves or logs, by where they are passed:
#: Lightning's ``Trainer(...)`` and ``ModelCheckpoint(...)``, the HF ``TrainingArguments(...)``,
#: Keras ``Model.fit(...)``.
LIGHTNING_TRAINER_KNOBS = ("val_check_interval", "check_val_every_n_epoch", "limit_val_batches", "log_every_n_steps")
LIGHTNING_CHECKPOINT_KNOBS = ("every_n_train_steps",)
HF_ARGS_KNOBS = ("eval_steps", "save_steps", "logging_steps")
KERAS_FIT_KNOBS = ("validation_freq",)
FREQUENCY_KNOBS = LIGHTNING_TRAINER_KNOBS + LIGHTNING_CHECKPOINT_KNOBS + HF_ARGS_KNOBS + KERAS_FIT_KNOBS
#: The DataLoader arguments among :data:`KNOBS`.
LOADER_KNOBS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")
AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: ``autocast`` value that turns the program's own ``torch.autocast`` regions off (float32).
AUTOCAST_OFF = "off"


def parse(text: str | None) -> tuple[dict, list[str]]:
    """Settings from the :data:`ENV` text: ``(settings, problems)``; a setting of an unknown name or
    the wrong type is left out and named in ``problems``. Never raises."""
    if not text:
        return {}, []
    try:
        raw = json.loads(text)
    except ValueError:
        return {}, [f"{ENV} is not JSON; no setting applied"]
    if not isinstance(raw, dict):
        return {}, [f"{ENV} is not a JSON object; no setting applied"]
    out, problems = {}, []
    for name, value in raw.items():
        kind = KNOBS.get(name)
        ok = kind is not None and isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if ok and kind is int and value < (1 if name in ("batch_size", "threads", "prefetch_factor", "replay") else 0):
            ok = False
        if ok and name in FREQUENCY_KNOBS and not value > 0:  # every N steps / epochs, or a fraction of an epoch
            ok = False
        if ok and name == "autocast" and value not in AUTOCAST_DTYPES and value != AUTOCAST_OFF:
            ok = False
        if ok:
            out[name] = value
        else:
            problems.append(f"setting {name}={value!r} is unknown or of the wrong type; not applied")
    return out, problems


class Overrides:
    """The process's trial settings and the records of where each applied.

    Args:
        agent: the process's :class:`whyidle.instrument.agent.Agent`.
        settings: :func:`parse` result.
    """

    def __init__(self, agent, settings: dict, scratch: str | None = None) -> None:
        self.agent = agent
        self.settings = dict(settings)
        self.scratch = scratch
        self.used: set[str] = set()
        self._said: set[tuple] = set()
        agent.on_exit.insert(0, self.unused)

    def note(self, name: str, applied: bool, *, was=None, site: str | None = None, why: str | None = None,
             value=None) -> None:
        """Records one application of setting ``name`` (once per name, site and outcome)."""
        key = (name, site, applied, why)
        if key in self._said:
            return
        self._said.add(key)
        self.used.add(name)
        value = self.settings.get(name) if value is None else value
        was = was if isinstance(was, (int, float, str, bool, type(None))) else repr(was)[:80]
        self.agent.record({"k": "override", "t": time.monotonic_ns(), "name": name, "value": value,
                           "applied": applied, "was": was, "site": site, "why": why})
        self.agent.start_background()

    def scratch_path(self, path) -> str | None:
        """Where a trial writes what the program saves to ``path`` (str or PathLike): the same
        relative path under the scratch folder (an absolute path outside the working directory
        keeps its whole path below ``abs/``); None for anything else or without a scratch folder."""
        if not self.scratch or not isinstance(path, (str, os.PathLike)):
            return None
        full = os.path.abspath(os.fspath(path))
        if full.startswith(os.path.abspath(self.scratch) + os.sep):
            return None  # already there (a writer called by another writer)
        rel = os.path.relpath(full, os.getcwd())
        if rel.startswith(os.pardir):
            rel = os.path.join("abs", full.lstrip(os.sep))
        return os.path.join(self.scratch, rel)

    def redirect(self, args: tuple, kwargs: dict, entry: str) -> tuple[tuple, dict]:
        """A checkpoint writer's arguments with its destination path moved under the scratch folder
        (the first destination keyword of :data:`whyidle.instrument.saves.DEST_KWARGS`, else the
        first path-like positional argument); recorded once per destination. Never raises."""
        from whyidle.instrument.saves import DEST_KWARGS

        try:
            key = next((k for k in DEST_KWARGS if k in kwargs), None)
            index = None if key else next((i for i, a in enumerate(args) if isinstance(a, (str, os.PathLike))), None)
            old = kwargs[key] if key else args[index] if index is not None else None
            new = self.scratch_path(old)
            if new is None:
                return args, kwargs
            os.makedirs(os.path.dirname(new) or ".", exist_ok=True)
            if key:
                kwargs = dict(kwargs, **{key: new})
            else:
                args = args[:index] + (new,) + args[index + 1:]
            self.note("outputs", True, was=os.fspath(old), value=new, site=entry)
        except Exception as exc:
            self.agent.notice(f"checkpoint path not redirected: {exc!r}")
        return args, kwargs

    def unused(self) -> None:
        """At exit: a setting nothing in the program took is recorded as not applied."""
        for name in self.settings:
            if name not in self.used:
                off = name == "autocast" and self.settings[name] == AUTOCAST_OFF
                self.note(name, False, why="the program entered no torch.autocast region" if off else
                          _UNUSED.get(name, "nothing in the program used it"))


_UNUSED = {
    "threads": "PyTorch was not imported", "cudnn_benchmark": "PyTorch was not imported",
    "tf32": "PyTorch was not imported", "autocast": "no module forward ran",
    "tfdata_parallel_map": "no tf.data map() call without num_parallel_calls",
    "tfdata_prefetch": "no tf.data dataset was given to Model.fit",
    "every_n_train_steps": "no Lightning ModelCheckpoint was built",
    "validation_freq": "Model.fit was not called",
    "replay": "no DataLoader yielded that many batches",
}
for _name in LIGHTNING_TRAINER_KNOBS:
    _UNUSED[_name] = "no Lightning Trainer was built"
for _name in HF_ARGS_KNOBS:
    _UNUSED[_name] = "no Hugging Face TrainingArguments were built"
for _name in LOADER_KNOBS:
    _UNUSED[_name] = "no DataLoader was built"


def from_agent(agent) -> Overrides | None:
    """The process's :class:`Overrides` (made once from :data:`ENV`), or None without settings or
    in a process started by :mod:`multiprocessing` (a DataLoader worker)."""
    have = getattr(agent, "overrides", False)
    if have is not False:
        return have
    agent.overrides = None
    text, scratch = os.environ.get(ENV), os.environ.get(SCRATCH_ENV) or None
    if not (text or scratch) or _mp_child():
        return None
    settings, problems = parse(text)
    for p in problems:
        agent.notice(p)
    if settings or scratch:
        agent.overrides = Overrides(agent, settings, scratch)
    return agent.overrides


def redirect(agent, args: tuple, kwargs: dict, entry: str) -> tuple[tuple, dict]:
    """For a checkpoint writer's wrapper (:func:`whyidle.instrument.regions.wrap`): its arguments,
    with the destination under the trial's scratch folder inside a ``whyidle tune`` trial."""
    ov = from_agent(agent)
    return ov.redirect(args, kwargs, entry) if ov is not None and ov.scratch else (args, kwargs)


def _mp_child() -> bool:
    mp = sys.modules.get("multiprocessing")
    try:
        return mp is not None and mp.parent_process() is not None
    except Exception:
        return False


def _user_site(depth: int = 2) -> str | None:
    """``file:line`` of the first frame outside whyidle and the frameworks, from ``depth`` up."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    lib = (os.sep + "whyidle" + os.sep, os.sep + "torch" + os.sep, os.sep + "tensorflow" + os.sep,
           os.sep + "keras" + os.sep, "site-packages", "dist-packages", "<frozen")
    first = None
    while frame is not None:
        name = frame.f_code.co_filename
        here = f"{os.path.basename(name)}:{frame.f_lineno}"
        first = first or here
        if not any(p in name for p in lib):
            return here
        frame = frame.f_back
    return first


# --- PyTorch -----------------------------------------------------------------------------------

def install_torch(agent, torch) -> None:
    """Applies the process-wide PyTorch settings and wraps ``DataLoader.__init__`` (call before the
    torch instrumentation wraps it, so its own wrapper sees the user's call site). Errors:
    propagates patching errors (the agent's installer turns them into one notice)."""
    ov = from_agent(agent)
    if ov is None:
        return
    if ov.scratch:
        _redirect_loads(ov, torch)
    s = ov.settings
    if "threads" in s:
        was = torch.get_num_threads()
        torch.set_num_threads(s["threads"])
        ov.note("threads", True, was=was, site="torch.set_num_threads")
    if "cudnn_benchmark" in s:
        was = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = s["cudnn_benchmark"]
        ov.note("cudnn_benchmark", True, was=was, site="torch.backends.cudnn.benchmark")
    if "tf32" in s:
        was = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if s["tf32"] else "highest")
        torch.backends.cudnn.allow_tf32 = s["tf32"]
        ov.note("tf32", True, was=was, site="torch.set_float32_matmul_precision")
    if s.get("autocast") == AUTOCAST_OFF:
        _disable_autocast(ov, torch)
    elif "autocast" in s:
        _install_autocast(ov, torch)
    if any(k in s for k in LOADER_KNOBS):
        _wrap_loader(ov, torch)
    if "compile_dynamic" in s and getattr(torch, "compile", None) is not None:
        _wrap_compile(ov, torch)
    if "replay" in s:
        from whyidle.instrument import replay

        replay.install(ov, torch)


def _wrap_compile(ov: Overrides, torch) -> None:
    """``torch.compile`` called with ``dynamic=`` the trial's ``compile_dynamic``."""
    import functools

    orig = torch.compile

    @functools.wraps(orig)
    def compile(*args, **kwargs):
        was = kwargs.get("dynamic")
        kwargs["dynamic"] = ov.settings["compile_dynamic"]
        ov.note("compile_dynamic", True, was=was, site=_user_site())
        return orig(*args, **kwargs)

    torch.compile = compile


def _redirect_loads(ov: Overrides, torch) -> None:
    """``torch.load(path)`` reads the trial's own copy when the trial saved one (a program that
    saves its best model and loads it back)."""
    import functools

    orig = torch.load

    @functools.wraps(orig)
    def load(f, *args, **kwargs):
        new = ov.scratch_path(f)
        return orig(new if new and os.path.exists(new) else f, *args, **kwargs)

    torch.load = load


def _wrap_loader(ov: Overrides, torch) -> None:
    import functools
    import inspect

    import torch.utils.data.dataloader as dl

    orig = dl.DataLoader.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        try:
            bound = sig.bind(self, *args, **kwargs)
            bound.arguments.update(loader_arguments(ov, bound.arguments, _user_site()))
        except Exception as exc:  # the program's own call, unchanged
            ov.agent.notice(f"DataLoader settings not applied: {exc!r}")
            return orig(self, *args, **kwargs)
        return orig(*bound.args, **bound.kwargs)

    dl.DataLoader.__init__ = __init__


def loader_arguments(ov: Overrides, arguments: dict, site: str | None) -> dict:
    """The DataLoader arguments to change for the trial, given the call's bound ``arguments``
    (name → value as passed; defaults absent); records each application or refusal.

    Rules (PyTorch's own checks, which would otherwise raise): ``persistent_workers`` and
    ``prefetch_factor`` need ``num_workers > 0`` (with 0 they are left as they are); ``batch_size``
    does not apply when a ``batch_sampler`` gives the batches, when the dataset yields batches
    itself (``batch_size=None``), or when ``drop_last`` is set and the dataset holds fewer samples
    than the batch (no batch at all).
    """
    s = ov.settings
    out = {}
    workers = s.get("num_workers", arguments.get("num_workers", 0))
    if "num_workers" in s:
        out["num_workers"] = s["num_workers"]
        ov.note("num_workers", True, was=arguments.get("num_workers", 0), site=site)
        if s["num_workers"] == 0:  # options only valid with workers must go with them
            for name in ("persistent_workers", "prefetch_factor"):
                if arguments.get(name):
                    out[name] = False if name == "persistent_workers" else None
    if "pin_memory" in s:
        out["pin_memory"] = s["pin_memory"]
        ov.note("pin_memory", True, was=arguments.get("pin_memory", False), site=site)
    for name in ("persistent_workers", "prefetch_factor"):
        if name not in s:
            continue
        if workers > 0:
            out[name] = s[name]
            ov.note(name, True, was=arguments.get(name), site=site)
        else:
            ov.note(name, False, site=site, why="needs num_workers > 0")
    if "batch_size" in s:
        why = None
        sampler = arguments.get("batch_sampler")
        if sampler is not None and getattr(sampler, "batch_size", None) == s["batch_size"]:
            return out  # a DataLoader rebuilt from one that took the setting (Accelerate's prepare)
        if sampler is not None:
            why = "a batch_sampler gives the batches"
        elif "batch_size" in arguments and arguments["batch_size"] is None:
            why = "the dataset yields whole batches (batch_size=None)"
        elif arguments.get("drop_last"):
            try:
                if len(arguments["dataset"]) < s["batch_size"]:
                    why = f"drop_last=True and the dataset holds only {len(arguments['dataset'])} samples"
            except Exception:
                pass
        if why is None:
            out["batch_size"] = s["batch_size"]
        ov.note("batch_size", why is None, was=arguments.get("batch_size", 1), site=site, why=why)
    return out


def _disable_autocast(ov: Overrides, torch) -> None:
    """Every ``torch.autocast`` (``torch.amp.autocast``, the deprecated ``torch.cuda.amp`` /
    ``torch.cpu.amp`` ones, which call it) is made with ``enabled=False``: the regions the program
    (or its framework) runs under autocast run in float32. Recorded once per call site with the
    dtype it had."""
    import functools
    import inspect

    cls = torch.amp.autocast_mode.autocast
    orig = cls.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        try:
            bound = sig.bind(self, *args, **kwargs)
            was = bound.arguments.get("dtype")
            if bound.arguments.get("enabled", True):
                bound.arguments["enabled"] = False
                ov.note("autocast", True, was=str(was) if was is not None else "enabled", site=_user_site())
        except Exception as exc:  # the program's own call, unchanged
            ov.note("autocast", False, why=f"torch.autocast arguments not read: {exc!r}"[:200])
            return orig(self, *args, **kwargs)
        return orig(*bound.args, **bound.kwargs)

    cls.__init__ = __init__


def _install_autocast(ov: Overrides, torch) -> None:
    """The outermost module call of each forward runs under ``torch.autocast`` of the device its
    first parameter is on (global forward hooks; the exit hook runs even when the forward raises)."""
    from torch.nn.modules import module as module_mod

    dtype = getattr(torch, AUTOCAST_DTYPES[ov.settings["autocast"]])
    state = {"depth": 0, "ctx": None}

    def pre(module, args):
        state["depth"] += 1
        if state["depth"] != 1:
            return
        try:
            param = next(module.parameters(), None)
            device = param.device.type if param is not None else "cpu"
            state["ctx"] = torch.autocast(device_type=device, dtype=dtype)
            state["ctx"].__enter__()
            ov.note("autocast", True, site=f"{type(module).__name__}.forward ({device})")
        except Exception as exc:
            state["ctx"] = None
            ov.note("autocast", False, why=f"torch.autocast refused: {exc}"[:200])

    def post(module, args, output):
        state["depth"] -= 1
        if state["depth"] == 0 and state["ctx"] is not None:
            ctx, state["ctx"] = state["ctx"], None
            ctx.__exit__(None, None, None)

    module_mod.register_module_forward_pre_hook(pre)
    module_mod.register_module_forward_hook(post, always_call=True)


# --- how often a framework evaluates, saves and logs ---------------------------------------------

def _wrap_init(ov: Overrides, cls, knobs: tuple, adjust=None) -> None:
    """``cls.__init__`` with the trial's settings among ``knobs`` replacing the arguments the
    program passed (or adding them); ``adjust(arguments)`` then drops what would conflict. A
    parameter this version of ``cls`` lacks is recorded as not applied."""
    import functools
    import inspect

    wanted = [k for k in knobs if k in ov.settings]
    orig = getattr(cls, "__init__", None)
    if not wanted or orig is None or getattr(orig, "__whyidle_overrides__", False):
        return
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        site = _user_site()
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:  # the program's call is wrong by itself: let it raise as it would
            return orig(self, *args, **kwargs)
        for name in wanted:
            if name not in sig.parameters:
                ov.note(name, False, site=site, why=f"this version's {cls.__name__} takes no {name}")
                continue
            ov.note(name, True, was=bound.arguments.get(name), site=site)
            bound.arguments[name] = ov.settings[name]
        if adjust is not None:
            adjust(bound.arguments)
        return orig(*bound.args, **bound.kwargs)

    __init__.__whyidle_overrides__ = True
    cls.__init__ = __init__


def _one_checkpoint_trigger(arguments: dict) -> None:
    """``ModelCheckpoint`` takes one of ``every_n_train_steps``, ``every_n_epochs`` and
    ``train_time_interval`` (it raises for several): the trial's step interval replaces the others."""
    for other in ("every_n_epochs", "train_time_interval"):
        if arguments.get(other) is not None:
            arguments[other] = None


def install_lightning(agent, module) -> None:
    """Lightning ``Trainer(...)`` and ``ModelCheckpoint(...)`` take the trial's evaluation,
    logging and checkpoint frequencies (:data:`LIGHTNING_TRAINER_KNOBS`,
    :data:`LIGHTNING_CHECKPOINT_KNOBS`). Errors: propagates patching errors."""
    ov = from_agent(agent)
    if ov is None:
        return
    pkg = getattr(module, "pytorch", module)  # lightning.pytorch / pytorch_lightning
    trainer = getattr(pkg, "Trainer", None)
    if trainer is not None:
        _wrap_init(ov, trainer, LIGHTNING_TRAINER_KNOBS)
    checkpoint = getattr(getattr(pkg, "callbacks", None), "ModelCheckpoint", None)
    if checkpoint is not None:
        _wrap_init(ov, checkpoint, LIGHTNING_CHECKPOINT_KNOBS, _one_checkpoint_trigger)


def install_hf_args(agent, module) -> None:
    """The HF ``TrainingArguments(...)`` (``transformers.training_args``) take the trial's
    ``eval_steps``, ``save_steps``, ``logging_steps``. Errors: propagates patching errors."""
    ov = from_agent(agent)
    args = getattr(module, "TrainingArguments", None)
    if ov is not None and args is not None:
        _wrap_init(ov, args, HF_ARGS_KNOBS)


# --- TensorFlow / Keras ------------------------------------------------------------------------

def install_tf(agent, tf) -> None:
    """tf.data settings: ``map`` without ``num_parallel_calls`` runs with ``tf.data.AUTOTUNE``;
    ``batch`` takes the trial's ``batch_size``. Errors: propagates patching errors."""
    ov = from_agent(agent)
    if ov is None:
        return
    import functools

    cls = tf.data.Dataset
    s = ov.settings
    if s.get("tfdata_parallel_map"):
        orig_map = cls.map

        @functools.wraps(orig_map)
        def map(self, map_func, num_parallel_calls=None, *args, **kwargs):
            if num_parallel_calls is None:
                num_parallel_calls = tf.data.AUTOTUNE
                ov.note("tfdata_parallel_map", True, was=None, site=_user_site())
            return orig_map(self, map_func, num_parallel_calls, *args, **kwargs)

        cls.map = map
    if "batch_size" in s:
        orig_batch = cls.batch

        @functools.wraps(orig_batch)
        def batch(self, batch_size, *args, **kwargs):
            ov.note("batch_size", True, was=_static(batch_size), site=_user_site())
            return orig_batch(self, s["batch_size"], *args, **kwargs)

        cls.batch = batch


def _static(value):
    try:
        return int(value)
    except Exception:
        return None


def install_keras(agent, keras) -> None:
    """``Model.fit``: ``batch_size`` replaces the argument for array inputs; ``tfdata_prefetch``
    adds ``.prefetch(tf.data.AUTOTUNE)`` to a tf.data dataset that does not end in one. Call after
    the Keras instrumentation wrapped ``fit`` (it then sees the trial's values). Errors: propagates
    patching errors."""
    ov = from_agent(agent)
    if ov is None or not ({"batch_size", "tfdata_prefetch", *KERAS_FIT_KNOBS} & set(ov.settings)):
        return
    import functools
    import inspect

    orig = keras.Model.fit
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def fit(self, *args, **kwargs):
        try:
            bound = sig.bind(self, *args, **kwargs)
            fit_arguments(ov, bound.arguments, _user_site())
        except Exception as exc:
            ov.agent.notice(f"Model.fit settings not applied: {exc!r}")
            return orig(self, *args, **kwargs)
        return orig(*bound.args, **bound.kwargs)

    keras.Model.fit = fit


def fit_arguments(ov: Overrides, arguments: dict, site: str | None) -> None:
    """Changes ``Model.fit``'s bound ``arguments`` in place for the trial and records each
    application or refusal (``batch_size`` applies to arrays only: a dataset or generator is
    batched by the program)."""
    s = ov.settings
    x = arguments.get("x")
    dataset = type(x).__module__.startswith("tensorflow") and hasattr(x, "prefetch")
    if "batch_size" in s:
        if dataset or not hasattr(x, "__len__") or hasattr(x, "__getitem__") and hasattr(x, "on_epoch_end"):
            if not dataset:  # a generator or PyDataset: batched in the program's own code
                ov.note("batch_size", False, site=site, why="fit() takes batches from a generator or PyDataset")
        else:
            ov.note("batch_size", True, was=arguments.get("batch_size"), site=site)
            arguments["batch_size"] = s["batch_size"]
    if s.get("tfdata_prefetch"):
        if dataset and type(x).__name__ not in ("PrefetchDataset", "_PrefetchDataset"):
            import tensorflow as tf

            arguments["x"] = x.prefetch(tf.data.AUTOTUNE)
            ov.note("tfdata_prefetch", True, site=site)
        elif dataset:
            ov.note("tfdata_prefetch", False, site=site, why="the dataset already ends in prefetch()")
    if "validation_freq" in s:
        ov.note("validation_freq", True, was=arguments.get("validation_freq", 1), site=site)
        arguments["validation_freq"] = s["validation_freq"]
