"""Diagnosis: facts → verdict and ranked findings (pure; no framework imports).

``diagnose`` runs every rule of :mod:`whyidle.diagnose.rules`; the verdict follows the one rule of
:mod:`whyidle.diagnose.verdict`: the warning/critical finding whose cause holds the largest measured
share of the step (``bound`` ≥ ``thresholds.VERDICT_MIN_BOUND``), whatever its fix can give here;
``"device_bound"`` when none does. With too few steps to judge the verdict is ``"unknown"``, unless
the GPU cannot be used at all (``wrong_device``, ``gpu_not_visible``, critical), which needs no steps
and answers the question before any other bottleneck does.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import (rules, rules_batch, rules_device, rules_compile, rules_gpu, rules_job, rules_keras, rules_loop, rules_precision,
                              rules_ranks, rules_startup, rules_work)
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.types import Finding
from whyidle.diagnose.verdict import choose_verdict, order


def _insufficient(facts: RunFacts) -> dict | None:
    info = facts.steps_info or {}
    step = facts.step
    if facts.primary is None:
        if not facts.instrumented:
            why = ("no Python process of the command imported PyTorch (a non-Python command, Python started with "
                   "-I or -S, or a framework whyidle does not instrument yet); host and GPU samples only")
        elif rules_keras.is_tf(facts) and (facts.input_wait or {}).get("reason"):
            why = facts.input_wait["reason"]
        elif rules_keras.is_tf(facts):
            why = ("Keras/TensorFlow was imported but no fit() batch and no eager iteration of a tf.data dataset "
                   "was seen (the program ended before training, or it feeds batches another way, e.g. NumPy "
                   "slices passed to a tf.function; only the host and GPU samples were recorded)")
        else:
            why = ("PyTorch was imported but no model call, backward(), optimizer step or DataLoader batch was seen "
                   "on the main thread (the program ended before its loop, or runs it in a process or thread "
                   "whyidle does not follow)")
        meta = facts.meta or {}
        code, signal = meta.get("exit_code"), meta.get("signal")
        if signal or (code is not None and code != 0):  # a missing script fails before importing anything
            ended = f"signal {signal}" if signal else f"exit code {code}"
            return rules.finding("no_steps", "info", "No training steps seen",
                                 f"No step data was seen: the program ended with {ended} before its first training "
                                 "step (see its error output).",
                                 {"instrumented_processes": len(facts.instrumented), "exit_code": code,
                                  "signal": signal}, None,
                                 "Fix the error that stopped the program, then run it under whyidle again.")
        fix = ("Run the training script itself under whyidle (whyidle run -- python train.py)." if not facts.instrumented
               else "If the program trains, run its training loop under whyidle: the loop of the command's own Python "
                    "processes is timed (on their main thread, or the thread of the first optimizer step).")
        return rules.finding("no_steps", "info", "No training steps seen", f"No step data was seen: {why}.",
                             {"instrumented_processes": len(facts.instrumented or [])}, None, fix)
    if step is None or step["steps"] < T.MIN_STEPS:
        n = step["steps"] if step else 0
        return rules.finding("too_few_steps", "info", "Too few steps to judge",
                             f"Only {info.get('total', 0)} steps were seen ({n} after warm-up); at least "
                             f"{T.MIN_STEPS} steady steps are needed for a diagnosis.",
                             {"steps": info.get("total", 0), "analyzed": n}, None,
                             "Run for more steps (a minute of training is plenty).")
    return None


def _cap_at_the_others_pace(findings: list[dict], late: dict, shared: frozenset = frozenset()) -> None:
    """A distributed job's report describes its straggler; fixing that rank's own cause makes the
    job no faster than the other ranks already are (the ``imbalance`` finding's ``est_speedup``:
    the straggler doing no more than they do). Its findings' estimates are capped there (a fresh
    user's DDP job with a slow rank: host_bound said 3.50×, the job gained 2.1–2.7×, imbalance
    2.45×), with ``evidence.est_capped_by = "imbalance"``. Findings about time outside the steps
    (``evidence.part_s``, start-up) keep theirs, and so do the ids in ``shared``: causes the other
    ranks have too (traces, where every rank's metrics are known), whose fix speeds them all up."""
    cap = late.get("est_speedup")
    if not cap:
        return
    for f in findings:
        if (f.get("evidence") or {}).get("part_s") is not None or f["id"].startswith("startup") or f["id"] in shared:
            continue  # whole-job time (evaluation, checkpoints, start-up): not the step's pace
        capped = False
        if f.get("est_speedup") and f["est_speedup"] > cap:
            f["est_speedup"] = cap
            capped = True
        for o in (f.get("fix") or {}).get("options") or []:
            if o.get("est_speedup") and o["est_speedup"] > cap:
                o["est_speedup"] = cap
                capped = True
        if capped:
            f["evidence"]["est_capped_by"] = "imbalance"


def _link_contention_to_input(facts: RunFacts, findings: list[dict]) -> None:
    """When the loader workers themselves wait for cores, data wait is a symptom of contention
    (other processes, or more threads than cores) that a fix can remove.

    Removing the contention would speed up both the training thread and the workers, so the
    ``cpu_contention`` estimate becomes 1/((1 − run-queue share)(1 − data-wait share)) and the
    ``input_bound`` finding says where its time comes from: its printed fix is the contention's,
    with that estimate.
    """
    contention = next((f for f in findings if f["id"] == "cpu_contention"), None)
    inp = next((f for f in findings if f["id"] == "input_bound"), None)
    delay = ((facts.host or {}).get("workers_run_delay_share"))
    if contention is None or inp is None or delay is None or delay < T.RUN_DELAY_WARN:
        return
    if contention["est_speedup"] is None:  # the job's own loading is the contention: nothing to remove
        return
    if contention["evidence"].get("no_workers"):  # its fix is no workers: a whole-step estimate, not scaled
        inp["fix"]["options"] = [rules.fix_option(contention["fix"]["text"], contention["est_speedup"],
                                                  "see cpu_contention", contention["fix"]["code"])] + [
            o for o in inp["fix"]["options"] if o["est_speedup"] is None or o["assumed"]]
        return
    share = inp["evidence"]["data_wait_share"]
    if contention["est_speedup"] is not None:
        contention["est_speedup"] = round(contention["est_speedup"] / (1.0 - min(share, 0.95)), 3)
    contention["bound"] = round(1.0 - (1.0 - contention["bound"]) * (1.0 - share), 4)
    contention["est_speedup_if_removed"] = round(rules.speedup_if_removed(contention["bound"]), 3)
    contention["evidence"]["workers_run_delay_share"] = round(delay, 4)
    contention["evidence"]["data_wait_share"] = share
    contention["summary"] = contention["summary"][:-1] + (
        f"; the loader workers wait for a core {delay:.0%} of the time too, which is why the step waits "
        f"for data {share:.0%} of the time.")
    inp["evidence"]["workers_run_delay_share"] = round(delay, 4)
    inp["evidence"]["suggested_num_workers"] = inp["evidence"]["num_workers"]
    inp["summary"] += f" The workers wait for a free core {delay:.0%} of the time (see cpu_contention)."
    # the printed fix becomes the contention's, with its gain; estimates made without the contention's
    # cost (more workers, packed batches) no longer hold: only the options without one stay
    first = rules.fix_option("The workers already wait for cores: fix the CPU contention first (see cpu_contention); "
                             "more workers would only compete for the same cores.", contention["est_speedup"],
                             "see cpu_contention")
    inp["fix"]["options"] = [first] + [o for o in inp["fix"]["options"] if o["est_speedup"] is None or o["assumed"]]


def _link_restarts_to_input(findings: list[dict]) -> None:
    """DataLoader workers started again every epoch (``epoch_boundary``) leave the steps after each
    restart waiting for them and count their start-up (importing the framework) as the workers'
    CPU: an ``input_bound`` measured then says more about the restarts than about the pipeline. It
    stays in the report as info, with that said, and no estimate; fix the restarts and measure again."""
    restarts = next((f for f in findings if f["id"] == "epoch_boundary"), None)
    inp = next((f for f in findings if f["id"] == "input_bound"), None)
    if restarts is None or inp is None:
        return
    inp["severity"] = "info"
    inp["est_speedup"] = None
    inp["evidence"]["measured_with_restarts"] = True
    inp["summary"] += (" Measured while the DataLoader's workers were started again every epoch (see epoch_boundary): "
                       "part of this wait, and of the workers' CPU, is their start-up.")
    inp["fix"].update(text="Keep the workers alive first (epoch_boundary's fix), then measure again: what is left of "
                           "this wait is the pipeline's own.", code=None, options=[])


def diagnose(facts: RunFacts) -> tuple[str, list[Finding]]:
    """Returns ``(verdict, findings)``: the verdict's finding first, then by severity and measured
    share (:func:`whyidle.diagnose.verdict.order`).

    ``facts`` is the output of :func:`whyidle.analysis.run.analyze`.
    """
    findings: list[dict] = []
    short = _insufficient(facts)
    if short is not None:
        findings.append(short)
    tf = rules_keras.is_tf(facts)
    not_visible = rules_keras.gpu_not_visible if tf else rules.gpu_not_visible
    for rule in (not_visible, rules.wrong_device, rules_gpu.model_not_moved, rules.cpu_contention):
        f = rule(facts)
        if f:
            findings.append(f)
    if short is None:
        for rule in (rules_keras.input_bound if tf else rules.input_bound, rules_batch.small_batch, rules_gpu.sync_bound, rules_gpu.pageable_transfers,
                     rules_gpu.cpu_built_tensors, rules_work.no_mixed_precision, rules_work.small_workload,
                     rules_work.debug_mode, rules_precision.emulated_precision,
                     rules_device.throttling):
            f = rule(facts)
            if f:
                findings.append(f)
        # Python work outside the model, or per-operation overhead inside it: one host_bound
        host = [f for f in (rules.host_bound(facts), rules.many_small_ops(facts), rules_work.module_loop(facts),
                            rules_work.preprocess_in_forward(facts), rules_work.model_hooks(facts)) if f]
        if host:
            findings.append(max(host, key=lambda f: f["bound"] or 0))
        breaks = rules_compile.graph_breaks(facts)
        if breaks:
            findings.append(breaks)
        for rule in (*rules_job.RULES, *rules_compile.RULES, rules_startup.startup_bound, rules_loop.no_training):  # time outside the step: bound is a share of the wall time
            f = rule(facts)
            if f:
                findings.append(f)
    if short is None:
        late = rules_ranks.imbalance(facts, findings)
        if late:
            _cap_at_the_others_pace(findings, late)
            findings.append(late)
        for rule in (rules_ranks.metric_collectives, rules_ranks.accumulation_all_reduce, rules_ranks.uneven_shards,
                     rules_ranks.data_parallel, rules_ranks.dist_config):
            f = rule(facts)
            if f:
                findings.append(f)
    _link_contention_to_input(facts, findings)
    _link_restarts_to_input(findings)
    causes = {f["evidence"].get("cause") for f in findings if f["id"] == "input_bound"}
    for f in findings:  # tf.data: smells whose fixed lines input_bound already shows
        if f["id"] == "input_bound":
            causes.update(f["evidence"].get("smells") or [])
    config = (rules_keras.input_pipeline_config if tf else rules.input_pipeline_config)(facts, causes)
    if config:
        findings.append(config)
    rules.printed_fix_first(findings)
    training = ((facts.time or {}).get("parts") or {}).get("training")
    verdict = choose_verdict(findings, judged=short is None, training_s=training["s"] if training else None)
    if verdict is None:
        verdict = "device_bound"
        findings.insert(0, rules.device_bound(facts, findings))
    return verdict, order(findings, verdict)
