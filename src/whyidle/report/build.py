"""Facts + diagnosis → the report object (contract ``whyidle.report/1``, see DESIGN.md)."""

from __future__ import annotations

import whyidle
from whyidle.analysis.facts import RunFacts
from whyidle.analysis.ranks import job_rate
from whyidle.diagnose.verdict import steady_verdict
from whyidle.redact import redact_argv
from whyidle.report import cell_sites
from whyidle.report.windows import changes, goodput

SCHEMA = "whyidle.report/1"

#: Host metrics copied into ``metrics.host`` (names and units documented in
#: :func:`whyidle.analysis.host.host_metrics`).
HOST_KEYS = ("cores", "cores_usable", "cores_limit_by", "cpu_affinity", "cpu_quota", "cpu_throttled_share",
             "cpu_throttled_s", "mem_limit_bytes", "cpu_busy_share", "percpu_busy_share", "iowait_share", "steal_share", "trainer_cores", "workers",
             "workers_cores", "worker_busy_share", "tree_other_cores", "other_procs_cores", "yielding_procs_cores", "whyidle_cores",
             "trainer_run_delay_share", "invol_ctx_per_s", "disk_read_bytes_per_s", "loader_read_bytes_per_s",
             "trainer_rss_max_bytes", "tree_rss_max_bytes", "tree_threads")


def _r(x):
    if isinstance(x, float):
        return round(x, 4) if abs(x) < 100 else round(x, 1)
    if isinstance(x, list):
        return [_r(v) for v in x]
    if isinstance(x, dict):
        return {k: _r(v) for k, v in x.items()}
    return x


#: GPU starvation keys of ``metrics.gpu`` (DESIGN.md), from the CUDA timeline.
IDLE_KEYS = ("busy_share", "idle_share", "starved_s", "idle_s_by_cause", "idle_share_by_cause", "idle_sites",
             "syncs", "idle_per_step", "idle_method")


def gpu_metrics_of(facts: RunFacts) -> dict | None:
    """``metrics.gpu``: NVML/GPM metrics plus the starvation measured by the CUDA timeline.

    ``None`` when neither observed a GPU. The starvation keys (:data:`IDLE_KEYS`) are ``None``
    when the timeline did not run (e.g. NVML sees a GPU the model never used).
    """
    gpu = dict(facts.gpu) if facts.gpu else None
    idle = facts.gpu_idle
    if idle is None:
        if gpu is not None:
            gpu.update(dict.fromkeys(IDLE_KEYS))
        return gpu
    if gpu is None:  # CUDA was used but NVML was not readable: its keys are null, not absent
        gpu = dict.fromkeys(("util_mean", "util_source", "sm_active_mean", "mem_util_mean", "memory_used_max_bytes",
                             "memory_total_bytes", "throttle_reasons"))
    gpu.update({
        "busy_share": 1.0 - idle["starved_share"],
        "idle_share": idle["starved_share"],
        "starved_s": idle["starved_s"],
        "idle_s_by_cause": idle["idle_s_by_cause"],
        "idle_share_by_cause": idle["idle_share_by_cause"],
        "idle_sites": idle["idle_sites"],
        "syncs": idle["syncs"],
        "idle_per_step": idle["per_step"],
        "idle_method": idle["method"],
    })
    return gpu


#: A teardown (after the last step) at least this long and this large a share of the wall time
#: gets a note: interpreter shutdown alone takes ~0.5 s.
TEARDOWN_NOTE_S = 2.0
TEARDOWN_NOTE_SHARE = 0.2


def notes_of(facts: RunFacts, problems: list[str]) -> list[str]:
    """Plain-language notes about what was (not) observed, for the end of the report."""
    meta = facts.meta or {}
    info = facts.steps_info or {}
    notes = list(problems)
    if meta.get("stopped"):  # a whyidle tune trial, stopped once measured
        notes.append(f"whyidle tune stopped the command ({meta['stopped']}); this report covers the steps before it.")
    elif meta.get("raised"):  # whyidle.watch() / %%whyidle: the watched code raised
        notes.append(f"The watched code raised {meta['raised']}; this report covers the steps before it.")
    elif meta.get("signal"):
        notes.append(f"The command was ended by signal {meta['signal']}"
                     f"{' (Ctrl-C)' if meta.get('interrupted') else ''}; this report covers the steps before it.")
    elif meta.get("exit_code") not in (None, 0):
        notes.append(f"The command exited with code {meta['exit_code']}; this report covers the steps before it.")
    elif meta.get("interrupted"):
        notes.append("whyidle received SIGINT (Ctrl-C) during the run; the command handled it and exited normally.")
    elif meta and "ended_utc" not in meta:
        notes.append("The run did not finish cleanly (whyidle was stopped); the report uses what was recorded.")
    if info.get("warmup"):
        notes.append(f"The first {info['warmup']} step(s) were treated as warm-up and left out of the shares.")
    if info.get("boundary_excluded"):
        parts = (facts.time or {}).get("parts") or {}
        held = [label for part, label in (("epoch_boundary", "epoch boundaries"), ("evaluation", "evaluation"),
                                          ("checkpoint", "checkpoint saving"), ("logging", "tracker logging"))
                if (parts.get(part) or {}).get("count")]
        held_text = (", ".join(held[:-1]) + " or " + held[-1]) if len(held) > 1 else (held[0] if held else
                                                                                   "an epoch boundary or evaluation")
        notes.append(f"{info['boundary_excluded']} step(s) holding {held_text} ({info['boundary_s']:.2f} s) were left "
                     "out of the steady-state shares; the wall-time split counts that time.")
    if info.get("compile_excluded"):
        notes.append(f"{info['compile_excluded']} step(s) holding a torch.compile compilation were left out of the "
                     "steady-state shares; the wall-time split counts the compilations (start-up, recompiling).")
    teardown = ((facts.time or {}).get("parts") or {}).get("teardown") or {}
    unrecorded = facts.records_end_s or 0.0
    if unrecorded >= TEARDOWN_NOTE_S:
        notes.append(f"The trainer's records end {unrecorded:.1f} s before the command did, without their last "
                     "record: the recording stopped early (a full, removed or read-only run directory, whyidle "
                     "killed, a damaged or cut file) or the process was killed. That time is not accounted (the "
                     "wall-time split counts it as teardown); steps, shares and samples/s cover what was recorded.")
    elif teardown.get("s", 0) >= TEARDOWN_NOTE_S and teardown.get("share", 0) >= TEARDOWN_NOTE_SHARE:
        top = (teardown.get("sites") or [{}])[0]
        where = (f", most of it at {top['site']}" + (f" inside {top['leaf']}" if top.get("leaf") and top["leaf"] != top["site"]
                                                    else "")) if top.get("site") else ""
        notes.append(f"After the last training step {teardown['s']:.1f} s ({teardown['share']:.0%} of the wall time) "
                     f"passed before the command exited{where}: a final evaluation or save, or the framework's "
                     "shutdown; no finding covers that time.")
    step = facts.step or {}
    if step.get("lite_steps"):
        n = step["steps"]
        full = n - step["lite_steps"]
        p50 = (step.get("step_time_s") or {}).get("p50")
        every = f"about one in {n / max(full, 1):.0f}, " if n >= 1.5 * full else ""
        notes.append(f"Steps were short (median {p50 * 1000:.1f} ms): to keep whyidle's cost under ~2 % of a step, "
                     f"phases, samples and CPU times were recorded on {full} of the {n} analyzed steps ({every}drawn "
                     "at random); step times cover every step (docs/run-format.md, detail stride).")
    if info.get("profiled_excluded"):
        what = ("whyidle's TensorFlow profiler window; they give the input-wait split"
                if facts.framework in ("keras", "tensorflow") else "a deep trace (torch.profiler), which slows them")
        notes.append(f"{info['profiled_excluded']} step(s) ran under {what} and were left out of the step times.")
    iw = facts.input_wait or {}
    if iw.get("method") == "tf_profiler":
        notes.append(f"Input wait inside Keras's compiled train step: {iw['ratio']:.0%} of its time in IteratorGetNext "
                     f"over {iw['calls']} profiled steps (TensorFlow profiler; trace kept in {iw.get('file')}), applied "
                     "to every step's measured train-function time.")
        for plane, share in iw.get("gpu_busy") or []:
            if share is not None:
                notes.append(f"{plane} ran kernels or copies {share:.0%} of the profiled steps' time (TensorFlow "
                             "profiler device trace).")
    elif iw.get("method") == "fit_input":
        backend = (facts.proc or {}).get("backend")
        notes.append(f"Keras on the {backend or 'torch or JAX'} backend: data wait is the time its training loop spent "
                     "taking each batch from fit's input, compute the train function's time less that"
                     + (". JAX runs each step asynchronously: a step runs from one step's completion to the next, "
                        "and the first (its jit compilation) is start-up." if backend == "jax" else "."))
    elif iw.get("method") == "iterator":
        notes.append("Custom TensorFlow loop: a step runs from one eager next() on a tf.data iterator to the next; "
                     "data wait is the time inside next(), compute the time inside tf.function calls, other host "
                     "the rest (Python, eager ops, logging). Work a tf.function leaves queued on a GPU is not "
                     "separated from the host time that follows it.")
    elif iw and iw.get("method") is None:
        notes.append(f"The input wait inside Keras's compiled train step was not measured ({iw.get('reason')}): "
                     "the 'compute' share includes it.")
    ranked = {r["pid"]: r for r in facts.ranks or []}
    if len(ranked) >= 2:
        me = ranked.get(facts.primary) or {}
        why = (", the rank the others wait for" if facts.straggler else
               " (no rank stands out: each one's work outside backward, and outside forward and backward, is within "
               "10 % of the others')")
        notes.append(f"A torch.distributed job of {len(ranked)} ranks observed (world size "
                     f"{me.get('world_size')}): samples/s is the job's, summed over the ranks; the step time, shares "
                     f"and findings describe rank {me.get('rank')} (pid {facts.primary}){why}; every rank's are "
                     "under 'ranks'.")
    for t in facts.other_trainers or []:
        if t["pid"] not in ranked or len(ranked) < 2:
            notes.append(f"Another training process (pid {t['pid']}) ran {t['steps']} steps; the report describes "
                         f"pid {facts.primary}.")
    gpu_notices = [r["msg"] for r in facts.gpu_records_notices or []]
    if facts.gpu is None and facts.gpu_idle is None:
        why = f" ({'; '.join(gpu_notices)})" if gpu_notices else ""
        notes.append(f"No NVIDIA GPU was observed{why}: GPU metrics are null.")
    else:
        notes += gpu_notices
        if facts.gpu_idle is None and facts.step:
            notes.append("GPU idle per cause was not measured: the model's parameters never reached CUDA "
                         "(or the CUDA timeline was off), so only NVML's utilization is shown.")
    notes += facts.notices or []
    return notes


def keras_of(facts: RunFacts) -> dict | None:
    """The report's ``keras`` block (Keras/TensorFlow runs only): ``input_wait`` (method, ratio of
    the train function spent in IteratorGetNext, profiled calls, reason when not measured),
    ``pipeline`` (the tf.data stages given to fit), ``fit`` (the fit calls: input kind, epochs,
    batch size, steps_per_execution), ``devices`` (GPUs TensorFlow sees, build, dtype policy)."""
    if facts.framework not in ("keras", "tensorflow"):
        return None
    iw = facts.input_wait
    tfdata = facts.tfdata or {}
    tfd = facts.tf_devices or {}
    return {
        "input_wait": {k: iw.get(k) for k in ("method", "ratio", "calls", "get_next_ms_mean", "fn_ms_mean", "reason",
                                              "iterators", "file", "gpu_busy")} if iw else None,
        "pipeline": tfdata.get("stages"),
        "calls": [{k: c.get(k) for k in ("fn", "input", "epochs", "batch_size", "steps_per_epoch",
                                         "steps_per_execution", "batches")} for c in facts.keras_calls or []],
        "devices": {k: v for k, v in tfd.items() if k not in ("k", "t")} or None,
    }


def api_of(facts: RunFacts) -> dict:
    """The report's ``api`` block: the training API the fixes are written for (``name``: ``torch``,
    ``lightning``, ``hf_trainer``, ``accelerate``, ``keras``, ``tensorflow``, ``none``), its
    ``label``, ``version``, the ``entries`` called, ``compiled`` (``torch.compile`` in use) and the
    recorded ``config`` (Trainer flags / TrainingArguments / Accelerator options)."""
    api = facts.api or {"name": (facts.framework or "none")}
    return {"name": api.get("name"), "label": api.get("label"), "version": api.get("version"),
            "entries": api.get("entries") or [], "compiled": bool(facts.compiled),
            "config": api.get("config") or {}}


def time_of(facts: RunFacts) -> dict | None:
    """``metrics.time``: the command's wall time by part (docs/report.md), or None."""
    t = facts.time
    if not t:
        return None
    return {"wall_s": t["wall_s"], "training_span_s": t["training_span_s"],
            "parts": {name: dict(p) for name, p in t["parts"].items()}}


def compile_of(facts: RunFacts) -> dict | None:
    """``metrics.compile`` (docs/report.md): torch.compile's compilations and their seconds, the
    recompilations, whether the recompile limit was hit, graph-break sites; None when the program
    compiled nothing."""
    c = facts.compile
    if not c:
        return None
    return {"compilations": c["compilations"], "compile_s": c["total_s"], "startup_compile_s": c["startup_s"],
            "later_compile_s": c["training_s"], "recompilations": c["recompilations"], "recompile_s": c["recompile_s"],
            "recompile_limit_hit": bool(c["limit"]), "graph_breaks": len(c["breaks"]),
            "compile_steps": c["compile_steps"], "cudagraph_recordings": c["cudagraph_recordings"], "observed": c["observed"],
            "call": dict(c["call"]) if c["call"] else None}


def loop_of(facts: RunFacts) -> dict | None:
    """``metrics.loop`` (docs/report.md): what ends a step (``marker``), whether the loop trains,
    the optimizers stepping in each step (``parts``), backward calls and outermost model calls per
    step and per second; None without steps."""
    loop, step = facts.loop, facts.step
    if not loop or not step:
        return None
    calls = loop.get("forward_calls_per_step")
    return {"marker": loop["marker"], "trains": loop["trains"],
            "parts": [{"name": p["name"], "class": p["cls"], "params": p["params"], "steps_per_step": p["steps_per_step"],
                       "backward_per_step": p["backward_per_step"]} for p in loop["parts"]],
            "backward_per_step": loop.get("backward_per_step"), "forward_calls_per_step": calls,
            "forward_calls_per_s": calls * step["steps_per_s"] if calls is not None else None}


#: A rank's row under the report's ``ranks`` (analysis/ranks.py).
RANK_KEYS = ("rank", "local_rank", "node", "world_size", "pid", "steps", "samples_per_s", "steady_samples_per_s",
             "step_time_s", "shares", "collective_s", "wait_s")


def build_report(facts: RunFacts, verdict: str, findings: list[dict], problems: list[str] | None = None) -> dict:
    """Assembles the report dict. ``facts`` from :func:`whyidle.analysis.run.analyze`."""
    meta = facts.meta or {}
    step = facts.step or {}
    info = facts.steps_info or {}
    host = facts.host or {}
    metrics = {
        "steps": info.get("total", 0),
        "steps_analyzed": step.get("steps", 0),
        "wall_s": meta.get("wall_s") if meta.get("wall_s") is not None else step.get("wall_s"),
        "train_wall_s": step.get("wall_s"),
        "samples_per_s": job_rate(facts.ranks or [], "samples_per_s") or (
            facts.job_samples_per_s if facts.job_samples_per_s is not None else step.get("samples_per_s")),
        "steady_samples_per_s": job_rate(facts.ranks or [], "steady_samples_per_s") or step.get("samples_per_s"),
        "steps_per_s": step.get("steps_per_s"),
        "batch_size": step.get("batch_size"),
        "batches_per_step": step.get("batches_per_step"),
        "micro_batches_per_step": step.get("micro_batches_per_step"),
        "detailed_steps": (step["steps"] - step.get("lite_steps", 0)) if step else None,
        "whyidle_share": step.get("whyidle_share"),
        "outside_share": step.get("outside_share"),
        "step_time_s": {k: step["step_time_s"][k] for k in ("p50", "p90", "mean")} if step else None,
        "shares": step.get("shares"),
        "data_wait_s_per_step": step.get("data_wait_s_per_step"),
        "data_cpu_share": step.get("data_cpu_share"),
        "gpu_step_ms": step.get("gpu_ms"),
        "host": {k: host.get(k) for k in HOST_KEYS} if host else None,
        "gpu": gpu_metrics_of(facts),
        "time": time_of(facts),
        "loop": loop_of(facts),
        "compile": compile_of(facts),
        "loader_workers": facts.loader_workers,
    }
    metrics["goodput"] = goodput(metrics)
    return _r({
        "schema": SCHEMA,
        "tool_version": whyidle.__version__,
        "source": "run",
        "command": redact_argv(meta.get("command") or []),  # already redacted when read; kept for callers' meta
        "name": meta.get("name"),
        "framework": (facts.framework or "none"),
        "api": api_of(facts),
        "device": facts.device,
        "verdict": verdict,
        "steady_verdict": steady_verdict(findings, verdict, (((facts.time or {}).get("parts") or {})
                                                             .get("training") or {}).get("s")),
        "findings": cell_sites.readable_findings(findings),  # "cell 5, line 28" in texts, not evidence
        "metrics": metrics,
        "loader": {k: v for k, v in facts.loader.items() if k not in ("k", "t", "id")} if facts.loader else None,
        "keras": keras_of(facts),
        "ranks": [{k: r[k] for k in RANK_KEYS} for r in facts.ranks] if len(facts.ranks or []) >= 2 else None,
        "straggler": facts.straggler,
        "logged_metrics": {name: {k: v for k, v in m.items() if k != "values"}
                           for name, m in (facts.logged or {}).items()},
        "run": {**{k: meta.get(k) for k in ("run_dir", "started_utc", "ended_utc", "exit_code", "signal", "interrupted")},
                **({"stopped": meta["stopped"]} if meta.get("stopped") else {})},
        "overrides": facts.overrides,
        **over_time(facts),
        "notes": notes_of(facts, problems or []),
    })


def over_time(facts: RunFacts) -> dict:
    """The rolling diagnosis in the report (docs/report.md): ``windows`` (each window's verdict,
    shares and goodput, time order), ``over_time`` (the runs of windows with one verdict:
    :func:`whyidle.report.windows.changes`), ``goodput`` (over the whole run,
    :func:`whyidle.report.windows.goodput` of the run's metrics is added by the caller) and
    ``deep_traces`` (each deep trace taken during the run, with its analysis). Empty lists when the
    run was recorded without windows."""
    windows = [{k: v for k, v in w.items() if k not in ("k", "t")} for w in facts.windows or []]
    traces = [{k: v for k, v in t.items() if k != "k"} for t in facts.deep_traces or []]
    return {"windows": windows, "over_time": changes(windows), "deep_traces": traces}


def logged_text(report: dict, limit: int = 6) -> str | None:
    """One line of the metrics the program logged (``logged_metrics``), for the terminal and HTML
    reports: ``"val_accuracy 0.994 (n=160) · loss 0.0123"``; None when there are none."""
    logged = report.get("logged_metrics") or {}
    if not logged:
        return None
    shown = [f"{name} {'n/a' if v.get('last') is None else format(v['last'], '.4g')}"
             + (f" (n={v['n']})" if v.get("n") else "") for name, v in list(logged.items())[:limit]]
    return " · ".join(shown) + (" · ..." if len(logged) > limit else "")


def framework_text(report: dict) -> str:
    """The framework as the terminal and HTML reports show it: ``"torch via Lightning 2.6.6"``,
    ``"torch (compiled)"``, ``"keras"``."""
    api = report.get("api") or {}
    text = str(report.get("framework"))
    if api.get("name") not in (None, report.get("framework")):
        text += f" via {api.get('label')}" + (f" {api['version']}" if api.get("version") else "")
    return text + (" (compiled)" if api.get("compiled") else "")


#: Verdicts that are not a finding's id, as the reports word them.
VERDICT_TEXT = {
    "device_bound": "DEVICE-BOUND: nothing upstream limits the device",
    "unknown": "UNKNOWN: not enough data to judge",
}


#: Findings that say why a report has no verdict (``unknown``).
UNKNOWN_REASONS = ("no_steps", "too_few_steps")


def verdict_line(report: dict) -> tuple[str, float | None, bool]:
    """The verdict as the terminal and HTML reports word it: ``(text, est_speedup of the verdict's
    finding or None, ok)`` where ``ok`` means nothing upstream of the device is to blame."""
    verdict = report.get("verdict")
    lead = next((f for f in report.get("findings") or [] if f.get("id") == verdict), None)
    why = next((f for f in report.get("findings") or [] if f.get("id") in UNKNOWN_REASONS), None)
    if verdict == "unknown" and why:  # say why: no steps, too few, or a trace without GPU activity
        text = f"UNKNOWN: {why['title'][0].lower()}{why['title'][1:]}"
    elif verdict in VERDICT_TEXT:
        text = VERDICT_TEXT[verdict]
    elif lead:
        text = f"{str(verdict).upper().replace('_', '-')}: {lead['title'].split(': ', 1)[-1]}"
    else:
        text = str(verdict)
    return text, (lead or {}).get("est_speedup"), verdict in VERDICT_TEXT


#: How the verdict line names a one-time part (``whyidle.diagnose.verdict.ONE_TIME``).
ONE_TIME_TEXT = {"startup_bound": "start-up"}


def steady_line(report: dict) -> str | None:
    """When the verdict leads only because the run was short (``steady_verdict``), what the
    terminal and HTML reports add to the verdict line: ``"only because this run was short:
    start-up 32 % of this 30 s run; in a longer run: INPUT-BOUND, 49 % of every step (fixing it:
    ~1.90× faster)"``; None otherwise. The shares are the findings' ``bound`` (of the wall time
    for the one-time part and whole-job findings, of the step for step findings)."""
    steady = report.get("steady_verdict")
    findings = report.get("findings") or []
    lead = next((f for f in findings if f.get("id") == report.get("verdict")), None)
    after = next((f for f in findings if f.get("id") == steady), None)
    if not steady or lead is None or after is None:
        return None
    wall = (report.get("metrics") or {}).get("wall_s")
    part = ONE_TIME_TEXT.get(lead["id"], str(lead["id"]).replace("_", " "))
    run = f"this {wall:.0f} s run" if wall else "this run"
    held = f"{lead.get('bound') or 0:.0%} of {run}"
    whole_job = (after.get("evidence") or {}).get("part_s") is not None
    of = "the wall time" if whole_job else "every step"
    gain = after.get("est_speedup")
    return (f"only because this run was short: {part} {held}; in a longer run: "
            f"{str(steady).upper().replace('_', '-')}, {after.get('bound') or 0:.0%} of {of}"
            + (f" (fixing it: ~{gain:.2f}× faster)" if gain else ""))


def option_gain(option: dict) -> str:
    """How one fix option (``finding.fix.options[i]``) is worded in the terminal and HTML reports:
    ``"est. 1.50× here; ≈8.3× with ≥ 10 cores …"`` or ``"gain not estimable here; …"``."""
    est = option.get("est_speedup")
    gain = f"est. {est:.2f}× here" if isinstance(est, (int, float)) else "gain not estimable here"
    return gain + (f"; {option['condition']}" if option.get("condition") else "")
