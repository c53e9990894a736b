"""Rules for the time outside the training step (:mod:`whyidle.analysis.accounting`): evaluation,
checkpoint saving, experiment-tracker logging and epoch boundaries.

For these findings ``bound`` is the part's share of the command's **wall time** (not of the step)
and ``est_speedup`` the wall-time ratio the printed fix gives; ``evidence.part_s`` holds the part's
seconds, which is what the verdict compares with the step findings' seconds
(:func:`whyidle.diagnose.verdict.choose_verdict`).
"""

from __future__ import annotations

import math

from whyidle.analysis import loop as loop_analysis
from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes, notebook
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import finding, fix_option
from whyidle.diagnose.types import Finding
from whyidle.vocab import TRACKERS


def part_of(facts: RunFacts, name: str) -> dict | None:
    parts = (facts.time or {}).get("parts") or {}
    return parts.get(name)


def trains(facts: RunFacts) -> bool:
    """Steps were analyzed and they train (:func:`whyidle.analysis.loop.trains`: an optimizer, a
    backward call or Keras ``fit`` marks them): a training job, whose evaluation competes with
    training (an inference-only script is all evaluation by design)."""
    if not facts.step:
        return False
    return facts.loop["trains"] if facts.loop else loop_analysis.trains(facts.step_rows or [])


def wall_gain(facts: RunFacts, saved_s: float) -> float:
    """Wall-time ratio when ``saved_s`` seconds of the command disappear."""
    wall = facts.time["wall_s"]
    return wall / max(wall - saved_s, wall * 0.05)


def loop_gain(facts: RunFacts, saved_s: float) -> float:
    """Training-loop ratio when ``saved_s`` seconds of it disappear: the loop's time (every part of
    ``time.parts`` but the one-time start-up and teardown: the steps and the evaluations,
    checkpoints, tracker logging, compilations and epoch boundaries that repeat with them, a last
    evaluation after the last step included) over that time less ``saved_s`` — what a longer run
    of the job gains, and what ``whyidle tune`` measures (steps pooled, those holding the part
    included). :func:`wall_gain` when the parts are unknown or the loop is shorter than ``saved_s``."""
    parts = (facts.time or {}).get("parts") or {}
    loop = sum((p or {}).get("s") or 0.0 for k, p in parts.items() if k not in ("startup", "teardown"))
    if loop <= 0 or saved_s > loop:
        return wall_gain(facts, saved_s)
    return loop / max(loop - saved_s, loop * 0.05)


def _gains(facts: RunFacts, saved_s: float | None) -> dict:
    """The evidence of a periodic part's estimate: ``est_basis`` (``"training_loop"``) and
    ``est_speedup_wall`` (the same saving over this run's whole wall time)."""
    return {"est_basis": "training_loop",
            "est_speedup_wall": round(wall_gain(facts, saved_s), 3) if saved_s else None}


def _evidence(part: dict, **more) -> dict:
    ev = {"part_s": round(part["s"], 3), "share_of_wall": round(part["share"], 4), "count": part["count"],
          "sites": part["sites"], "host_sites": part.get("host_sites") or [], "callers": part["callers"]}
    ev.update(more)
    return ev


def _warned(facts: RunFacts, name: str, warn: float, critical: float) -> tuple[dict | None, str | None]:
    """``(part, severity)`` of a training run's part whose wall-time share reaches ``warn``
    (``critical`` from that share), else ``(None, None)``."""
    part = part_of(facts, name)
    if part is None or not trains(facts):
        return None, None
    share = part["share"]
    sev = "critical" if share >= critical else ("warning" if share >= warn else None)
    return (part, sev) if sev else (None, None)


def _less_often_code(facts: RunFacts, k: int, interval: float | None) -> str:
    """Evaluate ``k``× less often, in the program's API (``interval``: training steps between two
    evaluations, when known)."""
    name = fixes.api_name(facts)
    cfg = (facts.api or {}).get("config") or {}
    if name == "lightning":
        vci = cfg.get("val_check_interval")
        if isinstance(vci, int) and not isinstance(vci, bool):  # every vci training batches
            arg, was = f"val_check_interval={k * vci}", f"   # was {vci}"
        elif isinstance(vci, float) and vci < 1.0:  # a fraction of the epoch
            arg, was = f"val_check_interval={min(1.0, k * vci):g}", f"   # was {vci:g}"
        else:
            arg, was = f"check_val_every_n_epoch={k * (cfg.get('check_val_every_n_epoch') or 1)}", ""
        if _val_subset(facts) < 1.0:
            return (f"trainer = Trainer(..., {arg},{was}\n"
                    f"                  limit_val_batches={LIGHTNING_VAL_SUBSET})   # a fixed quarter of the batches")
        return f"trainer = Trainer(..., {arg}){was}"
    if name == "hf_trainer":
        steps = cfg.get("eval_steps")
        if isinstance(steps, (int, float)) and steps:
            return (f"args = TrainingArguments(\n    ...,\n    eval_strategy=\"steps\",\n"
                    f"    eval_steps={k * steps:g},          # was {steps:g}: evaluate {k}x less often\n)")
        return f"args = TrainingArguments(\n    ...,\n    eval_strategy=\"epoch\",   # was {cfg.get('eval_strategy')!r}\n)"
    if name in ("keras", "tensorflow"):
        return (f"model.fit(..., validation_freq={k})   # validate every {k} epochs\n"
                "# epoch-end callbacks: return early unless epoch % N == N - 1")
    every = f"{k * interval:g}" if interval else f"{k} * EVAL_EVERY"
    return (f"EVAL_EVERY = {every}        # was {interval:g}: evaluate {k}x less often\n" if interval else
            f"EVAL_EVERY = {every}   # evaluate {k}x less often\n") + \
        "if step % EVAL_EVERY == 0:\n    ...   # the program's evaluation (under torch.inference_mode())"


#: Packages whose code runs the program's evaluation for it (their Python is not the program's to vectorize).
FRAMEWORK_PATHS = ("lightning/", "pytorch_lightning/", "transformers/", "accelerate/", "keras/", "tensorflow/")


def _in_framework(leaf: str | None) -> bool:
    return any(p in (leaf or "") for p in FRAMEWORK_PATHS)


def _vectorize_code(facts: RunFacts) -> str:
    """The evaluation's Python work on whole batches, in the program's API."""
    name = fixes.api_name(facts)
    if name in ("keras", "tensorflow"):
        return ("# one call for the whole validation set, not predict_on_batch per sample\n"
                "probs = model.predict(val_images, batch_size=256, verbose=0)\n"
                "# the metric / NMS on whole arrays: numpy, keras.ops"
                + (", tf.image.combined_non_max_suppression" if fixes.speaks_tensorflow(facts) else ""))
    if name == "lightning":
        return fixes.metric_code(facts, "metric")
    return ("# the metric on whole batches, on the device: no .tolist(), no per-sample Python loop\n"
            "pred = logits.argmax(1)\n"
            "correct = torch.bincount(y[pred == y], minlength=num_classes)   # per-class counts, one call\n"
            "keep = torchvision.ops.batched_nms(boxes, scores, labels, iou_threshold=0.5)   # detection: NMS per batch")


#: Fraction of the validation batches the Lightning fix keeps (``limit_val_batches``) when the
#: program validates on all of them.
LIGHTNING_VAL_SUBSET = 0.25


def _val_subset(facts: RunFacts) -> float:
    """The fraction of each evaluation the printed fix keeps: ``LIGHTNING_VAL_SUBSET`` for a
    Lightning ``Trainer`` validating on every batch (``limit_val_batches`` 1.0, Lightning's
    default: a float is a fraction, an int a batch count), else 1."""
    if fixes.api_name(facts) != "lightning":
        return 1.0
    lvb = ((facts.api or {}).get("config") or {}).get("limit_val_batches", 1.0)
    return LIGHTNING_VAL_SUBSET if lvb is None or (isinstance(lvb, float) and lvb >= 1.0) else 1.0


def _on_cpu(facts: RunFacts, part: dict, host_share: float) -> str | None:
    """Why the evaluation is judged to run on the CPU while training uses the GPU, or None:
    ``"weights"`` (PyTorch: the model put in eval mode has its weights on the CPU, the trained one
    on CUDA) or ``"gpu_idle"`` (the GPU at most ``T.EVAL_GPU_IDLE_PCT`` busy during an evaluation
    that runs a model, at least ``T.EVAL_TRAIN_GPU_PCT`` during training)."""
    devices = part.get("devices") or {}
    trained_on_gpu = "cuda" in ((facts.devices or {}).get("params") or {})
    if trained_on_gpu and devices.get("cpu", 0) * 2 >= sum(devices.values()) > 0:
        return "weights"
    ev_util, train_util = part.get("gpu_util_pct"), (part_of(facts, "training") or {}).get("gpu_util_pct")
    if (ev_util is not None and train_util is not None and ev_util <= T.EVAL_GPU_IDLE_PCT
            and train_util >= T.EVAL_TRAIN_GPU_PCT and host_share < T.EVAL_HOST_SHARE):
        return "gpu_idle"
    return None


def _to_device_code(facts: RunFacts) -> str:
    if fixes.api_name(facts) in ("keras", "tensorflow") and not fixes.speaks_tensorflow(facts):
        return ("# evaluate on the training's device: the training model itself, or a copy built where it was\n"
                "model.evaluate(val_data, verbose=0)")
    if fixes.api_name(facts) in ("keras", "tensorflow"):
        return ("# build (or load) the evaluation model outside any tf.device(\"/cpu:0\") scope,\n"
                "# or evaluate the training model itself:\n"
                "model.evaluate(val_ds, verbose=0)")
    return ("eval_model.to(device)   # the model you evaluate, on the GPU the training uses\n"
            "with torch.inference_mode():\n"
            "    for x, y in val_loader:\n"
            "        logits = eval_model(x.to(device, non_blocking=True))")


def eval_bound(facts: RunFacts) -> Finding | None:
    """Evaluation holds a large share of the wall time (``T.EVAL_WARN_SHARE`` / ``T.EVAL_CRITICAL_SHARE``).

    Cause (``evidence.cause``): ``on_cpu`` when training uses the GPU but the evaluation does not
    (:func:`_on_cpu`; cases.md C19: run it on the GPU, ``est_speedup`` removes 0.9 of its model
    time), ``host_work`` when most of the evaluation's sampled time is the program's own Python (a
    metric, NMS or decoding loop: vectorize it), else ``too_often`` (the model and the validation
    data: evaluate less often or on fewer batches).
    """
    part, sev = _warned(facts, "evaluation", T.EVAL_WARN_SHARE, T.EVAL_CRITICAL_SHARE)
    if part is None or (part["count"] <= 1 and sev != "critical"):
        return None
    mix = part.get("mix") or {}
    sampled = sum(mix.values())
    host_share = mix.get("host", 0.0) / sampled if sampled > 0 else 0.0
    n = max(1, part["count"])
    interval = part.get("every_steps")
    k = T.EVAL_LESS_OFTEN if n >= T.EVAL_LESS_OFTEN else 1
    kept = _val_subset(facts) / k  # the share of the evaluation time the printed code keeps
    less_often = loop_gain(facts, part["s"] * (1 - kept)) if kept < 1 else None
    host_fix = loop_gain(facts, part["s"] * host_share * T.VECTORIZED_SAVING) if host_share > 0 else None
    top = (part.get("host_sites") or [None])[0]
    where = f" ({top['site']})" if top else ""
    options = []
    on_cpu = _on_cpu(facts, part, host_share)
    if on_cpu:
        cause = "on_cpu"
        model_s = mix.get("model", 0.0) if sampled > 0 else part["s"] * (1 - host_share)
        why = (f"the model evaluated has its weights on the CPU ({(part.get('devices') or {}).get('cpu', 0)} of "
               f"{sum((part.get('devices') or {}).values())} evaluations) while training runs on CUDA"
               if on_cpu == "weights" else
               f"the GPU was {part['gpu_util_pct']:.0f} % busy during the evaluation and "
               f"{(part_of(facts, 'training') or {}).get('gpu_util_pct', 0):.0f} % during training")
        text = (f"Run the evaluation on the GPU: {why}. Move the evaluated model to the training's device (an EMA or "
                "copied model too), or build it outside a CPU device scope.")
        options.append(fix_option(text, loop_gain(facts, model_s * T.EVAL_ON_DEVICE_SAVING) if model_s > 0 else None,
                                  None, _to_device_code(facts)))
        if less_often:
            options.append(fix_option(f"Evaluate {k}x less often.", less_often, None,
                                      _less_often_code(facts, k, interval)))
    elif host_share >= T.EVAL_HOST_SHARE:
        cause = "host_work"
        text = (f"Vectorize the evaluation's own Python work{where}: {host_share:.0%} of the evaluation runs "
                "outside the model and the data loader (a per-sample metric, NMS or decoding loop). Compute the "
                "metric on whole batches with tensor ops (torchmetrics, torchvision.ops.batched_nms, keras.ops) "
                "and keep it on the device.")
        options.append(fix_option(text, host_fix, None, _vectorize_code(facts)))
        if less_often:
            options.append(fix_option(f"Evaluate {k}x less often.", less_often, None,
                                      _less_often_code(facts, k, interval)))
    else:
        cause = "too_often"
        train_s = (part_of(facts, "training") or {}).get("s") or 1e-9
        text = (f"Evaluate less often: {n} evaluations took {part['s']:.1f} s, {part['s'] / train_s:.1f}x the "
                "training time. Validate every few epochs, or on a fixed subset of the validation set"
                + (", under torch.inference_mode()." if fixes.api_name(facts) in ("torch", "accelerate") else "."))
        code = _less_often_code(facts, k if k > 1 else 2, interval)
        options.append(fix_option(text, less_often, None if k > 1 else "when the run evaluates more than once", code))
        if host_fix and host_share >= T.EVAL_HOST_OPTION_SHARE and top and not _in_framework(top.get("leaf")):
            options.append(fix_option(f"Vectorize the evaluation's Python work{where} ({host_share:.0%} of it).",
                                      host_fix))
    first = options[0]
    summary = (f"Evaluation took {part['s']:.1f} s, {part['share']:.0%} of the wall time ({n} evaluation"
               f"{'s' if n != 1 else ''}); training steps {(part_of(facts, 'training') or {}).get('s', 0):.1f} s.")
    return finding("eval_bound", sev, "Evaluation holds the job", summary,
                   _evidence(part, cause=cause, host_share=round(host_share, 3),
                             mix_s={k2: round(v, 3) for k2, v in mix.items()}, interval_steps=interval,
                             devices=part.get("devices"), gpu_util_pct=part.get("gpu_util_pct"),
                             training_gpu_util_pct=(part_of(facts, "training") or {}).get("gpu_util_pct"),
                             **_gains(facts, part["s"] * (1 - kept) if first["est_speedup"] == less_often else None)),
                   first["est_speedup"], first["text"], first["code"], bound=part["share"], options=options,
                   docs=["https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html"])


def checkpoint_bound(facts: RunFacts) -> Finding | None:
    """Checkpoint saving holds a large share of the wall time (``T.CHECKPOINT_WARN_SHARE``): save
    less often (so saving takes ``T.CHECKPOINT_TARGET_SHARE`` of the wall time), save only what
    resuming needs, or save asynchronously."""
    part, sev = _warned(facts, "checkpoint", T.CHECKPOINT_WARN_SHARE, T.CHECKPOINT_CRITICAL_SHARE)
    if part is None:
        return None
    n = max(1, part["count"])
    interval = part.get("every_steps")
    k = max(2, math.ceil(part["share"] / T.CHECKPOINT_TARGET_SHARE)) if n > 1 else 1
    gain = loop_gain(facts, part["s"] * (1 - 1 / k)) if k > 1 else None
    name = fixes.api_name(facts)
    every = f"{k * interval:g}" if interval else "N"
    if name == "lightning":
        code = (f"ModelCheckpoint(every_n_train_steps={every}, save_top_k=1,   # save {k}x less often\n"
                "                save_weights_only=True)   # the optimizer state only where you resume from")
    elif name == "hf_trainer":
        was = ((facts.api or {}).get("config") or {}).get("save_steps")
        code = (f"args = TrainingArguments(..., save_steps={every},   # was {was}\n"
                "                         save_total_limit=2, save_only_model=True)")
    elif name in ("keras", "tensorflow"):
        code = 'keras.callbacks.ModelCheckpoint(path, save_freq="epoch", save_weights_only=True)'
    else:
        code = (f"SAVE_EVERY = {every}   # steps; was {interval:g}\n" if interval else f"SAVE_EVERY = {every}\n") + \
            "if step % SAVE_EVERY == 0:\n" \
            "    torch.save(model.state_dict(), path)   # the optimizer state only where you resume from"
    top = part["callers"][0]["site"] if part["callers"] else None
    text = (f"Save checkpoints {k}x less often{f' ({top})' if top else ''}: {n} saves took {part['s']:.1f} s. "
            "Save the model's weights only, and the optimizer state only where you would resume from."
            if k > 1 else "Save only what resuming needs (weights, not the whole object) or save asynchronously.")
    summary = (f"Checkpoint saving took {part['s']:.1f} s, {part['share']:.0%} of the wall time ({n} save"
               f"{'s' if n != 1 else ''}, {part['s'] / n:.2f} s each).")
    storage = part.get("storage") or {}
    slow = _slow_storage(storage)
    options = [fix_option(text, gain, None, code)]
    if storage:
        rate = storage.get("bytes_per_s")
        summary += (f" {storage['mean_bytes'] / 1e6:.0f} MB a save, written to {storage.get('folder') or 'disk'}"
                    f" ({storage.get('fs_type') or 'unknown file system'}"
                    + (f", {rate / 1e6:.0f} MB/s" if rate else "") + ").")
    if slow:
        where = (f"{storage.get('fs_type')} is a {storage['fs_class']} file system" if slow == "remote" else
                 f"{rate / 1e6:.0f} MB/s is below a local disk's rate")
        local = ("Write the checkpoint to a local disk (local NVMe, /tmp) and copy it to "
                 f"{storage.get('folder') or 'its destination'} in the background: {where}, and the training loop "
                 "waits for every byte.")
        options.append(fix_option(local, None, f"the saves went to {storage.get('fs_type')} ({storage['fs_class']}) at "
                                  + (f"{rate / 1e6:.0f} MB/s" if rate else "an unknown rate"),
                                  "torch.save(state, \"/local_nvme/ckpt.pt\")   # fast local disk\n"
                                  "threading.Thread(target=shutil.copy, args=(\"/local_nvme/ckpt.pt\", remote_path)).start()"))
    options.append(fix_option("Save asynchronously: copy the state dict to CPU memory and let a background thread (or "
                              "torch.distributed.checkpoint.async_save) write it while training goes on.", None,
                              "when a core is free for the writer", None))
    cause = "slow_storage" if slow else ("too_often" if k > 1 else "large_saves")
    ev = _evidence(part, interval_steps=interval, mean_save_s=round(part["s"] / n, 4), cause=cause,
                   storage=_round_storage(storage) if storage else None,
                   **_gains(facts, part["s"] * (1 - 1 / k) if gain else None))
    return finding("checkpoint_bound", sev, "Checkpoint saving holds the job", summary, ev, gain, text, code,
                   bound=part["share"], options=options,
                   docs=["https://pytorch.org/tutorials/beginner/saving_loading_models.html",
                         "https://pytorch.org/docs/stable/distributed.checkpoint.html"])


def _slow_storage(storage: dict) -> str | None:
    """``"remote"`` when the saves went to a network, parallel or FUSE file system, ``"slow"`` when
    saves of at least ``T.CHECKPOINT_RATE_MIN_BYTES`` wrote below ``T.CHECKPOINT_SLOW_BPS``, else None."""
    if not storage:
        return None
    if storage.get("fs_class") in ("network", "parallel", "fuse"):
        return "remote"
    rate = storage.get("bytes_per_s")
    if rate is not None and storage.get("mean_bytes", 0) >= T.CHECKPOINT_RATE_MIN_BYTES and rate < T.CHECKPOINT_SLOW_BPS:
        return "slow"
    return None


def _round_storage(storage: dict) -> dict:
    out = dict(storage)
    for key in ("mean_bytes", "bytes_per_s"):
        if out.get(key) is not None:
            out[key] = round(out[key])
    return out


def logging_bound(facts: RunFacts) -> Finding | None:
    """Experiment-tracker logging (wandb, TensorBoard, MLflow) holds ``T.LOGGING_WARN_SHARE`` or
    more of the wall time: log every N steps. ``est_speedup`` counts the calls' seconds and the CPU
    seconds of the tracker's own background threads (``facts.threads`` of a package in
    :data:`whyidle.vocab.TRACKERS`: TensorBoard's event-file writer), which took cores and
    the GIL from the training; both shrink k× with the calls."""
    part, sev = _warned(facts, "logging", T.LOGGING_WARN_SHARE, T.LOGGING_CRITICAL_SHARE)
    if part is None:
        return None
    steps = max(1, len(facts.step_rows or []))
    per_step = part["count"] / steps
    k = T.LOG_EVERY
    writers = [t for t in facts.threads or [] if (t.get("module") or "").split(".")[0] in TRACKERS]
    writer_s = sum(t["cpu_s"] for t in writers)
    # the writer threads' CPU came out of the cores and the GIL the training thread needed; logging
    # k× less often cuts it as much as the calls themselves
    gain = loop_gain(facts, (part["s"] + writer_s) * (1 - 1 / k)) if per_step > 0.5 else None
    caller = part["callers"][0] if part["callers"] else {}
    top = caller.get("site") or "the logging call"
    sentence, code = fixes.logging_code(facts, caller.get("code") or "writer.add_scalar(...)   # the tracker call")
    summary = (f"Logging to an experiment tracker took {part['s']:.1f} s, {part['share']:.0%} of the wall time "
               f"({part['count']} calls, {per_step:.1f} per step)"
               + (f"; its writer thread{'s' if len(writers) > 1 else ''} ({', '.join(t['module'] for t in writers[:2])}) "
                  f"used another {writer_s:.1f} s of CPU beside the training" if writer_s >= 0.1 else "") + ".")
    return finding("logging_bound", sev, "Tracker logging holds the job", summary,
                   _evidence(part, calls_per_step=round(per_step, 2), writer_threads_cpu_s=round(writer_s, 3),
                             **_gains(facts, (part["s"] + writer_s) * (1 - 1 / k) if gain else None)), gain,
                   f"Log every {k} steps instead of every step ({top}). " + sentence, code, bound=part["share"])


def epoch_boundary(facts: RunFacts) -> Finding | None:
    """DataLoader iterator start-ups (workers started again each epoch) hold ``T.EPOCH_WARN_SHARE``
    or more of the wall time: ``persistent_workers=True`` starts them once."""
    part, sev = _warned(facts, "epoch_boundary", T.EPOCH_WARN_SHARE, T.EPOCH_CRITICAL_SHARE)
    if part is None or part["count"] < 1:
        return None
    loader = facts.loader or {}
    nw = loader.get("num_workers") or 0
    n = part["count"]
    saved = part["s"]
    if loader.get("rebuilt"):
        site = ((loader.get("created") or [None])[0]) or "its line"
        text = (f"Build the DataLoader once, before the epoch loop, with persistent_workers=True: {site} builds it "
                f"again every epoch ({loader['rebuilt']} times after the first), so its workers start again each "
                f"time ({part['s'] / n:.2f} s each); persistent_workers=True on that line alone changes nothing.")
        code = "# before the epoch loop:\n" + fixes.loader_code(facts, nw) if nw else None
    elif nw and not loader.get("persistent_workers"):
        text = (f"Keep the DataLoader's {nw} workers alive between epochs (persistent_workers=True): {n} new "
                f"epoch{'s' if n != 1 else ''} started them again ({part['s'] / n:.2f} s each"
                f"{', spawn start method' if loader.get('mp_context') in ('spawn', 'forkserver') else ''}).")
        code = fixes.loader_code(facts, nw)
    else:
        text = (f"Each of the {n} new DataLoader iterators took {part['s'] / n:.2f} s to start: make epochs longer "
                "(fewer, larger epochs), or move the per-epoch set-up out of the dataset's __iter__ / worker_init_fn.")
        code = None
        saved = saved / 2
    if code is not None:  # a notebook: a cell of its own for the DataLoader; spawn workers import its Dataset
        text, code = notebook.with_notes(text, code, notebook.worker_notes(facts, nw))
    summary = (f"Restarting the DataLoader's iterators took {part['s']:.1f} s, {part['share']:.0%} of the wall time "
               f"({n} epoch{'s' if n != 1 else ''} after the first, {part['s'] / n:.2f} s each).")
    return finding("epoch_boundary", sev, "Epoch boundaries hold the job", summary,
                   _evidence(part, num_workers=nw, persistent_workers=loader.get("persistent_workers"),
                             mp_context=loader.get("mp_context"), rebuilt=loader.get("rebuilt"), **_gains(facts, saved)),
                   loop_gain(facts, saved), text, code, bound=part["share"],
                   docs=["https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"])


RULES = (eval_bound, checkpoint_bound, logging_bound, epoch_boundary)
