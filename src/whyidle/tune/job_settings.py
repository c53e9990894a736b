"""Trial settings for the findings whose fix is a framework or loader setting outside the input
pipeline (pure): how often the job evaluates, saves and logs, workers kept between epochs,
autocast off, and worker counts within the usable cores.

Each function reads one finding of the baseline's report (``whyidle.report/1``) and the
program's recorded API settings (``api.config``: Lightning ``Trainer`` flags, ``TrainingArguments``)
and returns the trial that applies the finding's printed fix — the same values its code prints
(:mod:`whyidle.diagnose.rules_job`, :func:`whyidle.diagnose.fixes.logging_code`) — or None when
that fix is a code change whyidle cannot make by itself. The printed option's ``est_speedup`` is
the prediction the trial checks.
"""

from __future__ import annotations

import dataclasses
import math

from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules_job import LIGHTNING_VAL_SUBSET

#: The knob each finding's setting trial sets, per training API (documentation and the tune
#: output's "fix needs code" note name them).
KNOBS_BY_FINDING = {
    "eval_bound": {"lightning": ("val_check_interval", "check_val_every_n_epoch"), "hf_trainer": ("eval_steps",),
                   "keras": ("validation_freq",), "tensorflow": ("validation_freq",)},
    "checkpoint_bound": {"lightning": ("every_n_train_steps",), "hf_trainer": ("save_steps",)},
    "logging_bound": {"lightning": ("log_every_n_steps",), "hf_trainer": ("logging_steps",)},
}


@dataclasses.dataclass
class Trial:
    """One setting trial for finding ``finding``: ``settings`` (knob → value), ``predicted``
    (the printed option's ``est_speedup``, or None), ``why`` (one phrase)."""

    finding: str
    settings: dict
    predicted: float | None
    why: str


def _api(report: dict) -> tuple[str, dict]:
    api = report.get("api") or {}
    return api.get("name") or report.get("framework") or "none", api.get("config") or {}


def _option(f: dict, word: str) -> dict | None:
    """The finding's fix option whose code names ``word`` (the printed fix when it has no options)."""
    fix = f.get("fix") or {}
    for o in fix.get("options") or [{"code": fix.get("code"), "est_speedup": f.get("est_speedup")}]:
        if word in (o.get("code") or ""):
            return o
    return None


def _count(value) -> int | None:
    """``value`` when it is a whole count (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def evaluation(report: dict, f: dict) -> Trial | None:
    """``eval_bound``: evaluate ``T.EVAL_LESS_OFTEN``× less often (2× for fewer evaluations than
    that), as the printed fix: Lightning ``val_check_interval`` (× k when it is a step count, × k
    up to 1.0 when a fraction of the epoch) or ``check_val_every_n_epoch``, with
    ``limit_val_batches`` of :data:`whyidle.diagnose.rules_job.LIGHTNING_VAL_SUBSET` when it
    validates on every batch; HF ``eval_steps`` (``eval_strategy="steps"``); Keras
    ``validation_freq``."""
    name, cfg = _api(report)
    k = T.EVAL_LESS_OFTEN if (f["evidence"].get("count") or 0) >= T.EVAL_LESS_OFTEN else 2
    settings: dict = {}
    if name == "lightning":
        vci = cfg.get("val_check_interval")
        if _count(vci):
            settings["val_check_interval"] = k * vci
        elif isinstance(vci, float) and vci < 1.0:
            settings["val_check_interval"] = min(1.0, k * vci)
        else:
            settings["check_val_every_n_epoch"] = k * (_count(cfg.get("check_val_every_n_epoch")) or 1)
        lvb = cfg.get("limit_val_batches", 1.0)
        if lvb is None or (isinstance(lvb, float) and lvb >= 1.0):
            settings["limit_val_batches"] = LIGHTNING_VAL_SUBSET
    elif name == "hf_trainer" and cfg.get("eval_strategy") == "steps" and _count(cfg.get("eval_steps")):
        settings["eval_steps"] = k * cfg["eval_steps"]
    elif name in ("keras", "tensorflow"):
        settings["validation_freq"] = k
    if not settings:
        return None
    option = _option(f, next(iter(settings)))
    return Trial("eval_bound", settings, option.get("est_speedup") if option else None,
                 f"evaluate {k}x less often, as printed")


def checkpoint(report: dict, f: dict) -> Trial | None:
    """``checkpoint_bound``: save k× less often (k = the save share ÷
    ``T.CHECKPOINT_TARGET_SHARE``, at least 2), as the printed fix: Lightning
    ``ModelCheckpoint(every_n_train_steps=)``, HF ``save_steps``; needs the steps between two saves."""
    name, cfg = _api(report)
    ev = f["evidence"]
    interval = ev.get("interval_steps")
    if (ev.get("count") or 0) <= 1 or not interval:
        return None
    k = max(2, math.ceil(ev["share_of_wall"] / T.CHECKPOINT_TARGET_SHARE))
    if name == "lightning":
        settings = {"every_n_train_steps": int(round(k * interval))}
    elif name == "hf_trainer" and cfg.get("save_strategy") == "steps":
        settings = {"save_steps": int(round(k * (_count(cfg.get("save_steps")) or interval)))}
    else:
        return None
    option = _option(f, next(iter(settings))) or {"est_speedup": f.get("est_speedup")}
    return Trial("checkpoint_bound", settings, option.get("est_speedup"), f"save {k}x less often, as printed")


def logging(report: dict, f: dict) -> Trial | None:
    """``logging_bound``: Lightning ``log_every_n_steps`` / HF ``logging_steps`` of
    ``T.LOG_EVERY``, when the printed fix names that setting (a ``self.log`` call in a hook costs
    on every step whatever it says: a code change)."""
    name, _ = _api(report)
    knob = {"lightning": "log_every_n_steps", "hf_trainer": "logging_steps"}.get(name)
    option = _option(f, knob) if knob else None
    if option is None:
        return None
    return Trial("logging_bound", {knob: T.LOG_EVERY}, option.get("est_speedup"), f"log every {T.LOG_EVERY} steps")


def epoch_restarts(report: dict, f: dict) -> Trial | None:
    """``epoch_boundary``: ``persistent_workers=True`` when the loader has workers not kept between
    epochs (the printed fix); none when the program builds the DataLoader again every epoch
    (``evidence.rebuilt``: a new DataLoader has new workers whatever its settings, the fix is code)."""
    ev = f["evidence"]
    if (report.get("framework") != "torch" or not ev.get("num_workers") or ev.get("persistent_workers")
            or ev.get("rebuilt")):
        return None
    return Trial("epoch_boundary", {"persistent_workers": True}, f.get("est_speedup"),
                 "keep the workers between epochs, as printed")


def autocast_off(report: dict, f: dict) -> Trial | None:
    """``emulated_precision``: the program's ``torch.autocast`` regions off (float32)."""
    if report.get("framework") != "torch":
        return None
    return Trial("emulated_precision", {"autocast": "off"}, f.get("est_speedup"), "float32: the program's autocast off")


def fewer_workers(report: dict, f: dict, cores: int) -> list[Trial]:
    """``cpu_contention`` with loader workers (cause ``oversubscription`` or ``cpu_quota``: the job's
    own processes exceed its cores): the worker counts that fit the usable ``cores`` beside the
    training processes (``cores`` − processes, and none: loading in the training process). No
    prediction: the rule gives none for these (on 2 cores, ``-j 0`` measured 1.2× over 4 workers
    that the rule advised keeping, issue 32)."""
    ev = f["evidence"]
    workers, procs = ev.get("workers") or 0, max(1, ev.get("processes") or 1)
    if ev.get("cause") not in ("oversubscription", "cpu_quota"):  # other processes, steal: not the job's own count
        return []
    if report.get("framework") != "torch" or not (report.get("loader") or {}) or workers + procs <= cores:
        return []
    counts = sorted({max(0, cores - procs), 0} - {workers}, reverse=True)
    return [Trial("cpu_contention", {"num_workers": n}, None,
                  f"{n} loader worker{'s' if n != 1 else ''} within the {cores} usable cores") for n in counts]


def trials(report: dict, severe: list[dict], cores: int) -> list[Trial]:
    """Every setting trial of the ``severe`` findings (warning/critical) handled here, in the
    findings' order."""
    one = {"eval_bound": evaluation, "checkpoint_bound": checkpoint, "logging_bound": logging,
           "epoch_boundary": epoch_restarts, "emulated_precision": autocast_off}
    out: list[Trial] = []
    for f in severe:
        if f["id"] in one:
            t = one[f["id"]](report, f)
            out += [t] if t else []
        elif f["id"] == "cpu_contention":
            out += fewer_workers(report, f, cores)
    return out
