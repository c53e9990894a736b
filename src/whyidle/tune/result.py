"""The tune's outcome as ``whyidle.tune/1`` (docs/report.md, "Tuning"), written as
``tune.json`` and ``tune.html`` in the tune directory."""

from __future__ import annotations

import os
import time

import whyidle
from whyidle.cmdline import default_name
from whyidle.sampling import limits
from whyidle.tune import plan

SCHEMA = "whyidle.tune/1"


def _stats(summary: dict | None) -> dict:
    return (summary or {}).get("stats") or {}


def _applied(trial_reports: list[dict | None]) -> tuple[dict, list[dict]]:
    """Per setting: True (applied wherever the program made the choice), False (nowhere),
    ``"partial"``; and the refusals ``[{name, why, site}]``, from the trial runs' ``overrides``."""
    seen: dict[str, set] = {}
    refusals = []
    for rep in trial_reports:
        for o in (rep or {}).get("overrides") or []:
            if o["name"] == "outputs":  # a redirected checkpoint, not a setting
                continue
            seen.setdefault(o["name"], set()).add(bool(o["applied"]))
            if not o["applied"] and not any(r["name"] == o["name"] and r["why"] == o["why"] for r in refusals):
                refusals.append({"name": o["name"], "why": o["why"], "site": o["site"]})
    applied = {k: (True if v == {True} else False if v == {False} else "partial") for k, v in seen.items()}
    return applied, refusals


def build(tuner, base, win, validation, changed: dict, cmd: list[str]) -> dict:
    """``whyidle.tune/1`` from a finished :class:`whyidle.tune.session.Tuner`.

    Keys: ``schema``, ``tool_version``, ``command``, ``name`` (the script's), ``tune_dir``, ``budget_s``, ``elapsed_s``,
    ``trial_limit_s``, ``cores`` (those the job may use, :func:`whyidle.tune.plan.job_cores`), ``device``, ``interrupted``, ``baseline`` (``{run_dirs, status,
    samples_per_s, steps_per_s, ci, batch_size, data_wait_share, verdict, findings}``), ``trials``
    (best first: ``{label, settings, origin, why, predicted, status, detail, run_dirs,
    samples_per_s, ci, ratio, ratio_ci, claim, basis, batch_size, data_wait_share, verdict, applied,
    not_applied, outputs_redirected, stopped, seconds}``), ``winner`` (``{label, settings, ratio, ci, code, statement}``
    or null: no trial measured faster), ``batch`` (the ladder: ``{largest_stable, fastest, note}``
    or null), ``estimates`` (``[{finding, label, predicted, measured, ci, error}]``: each
    finding's ``est_speedup`` against the trial that applied its fix), ``input_ceiling``
    (:func:`input_ceiling`, or null), ``code_fixes``
    (:func:`code_fixes`: the findings whose fix needs code, with their estimates), ``validation``,
    ``outputs_changed`` (``{trial label: {created, modified}}``: files under the working
    directory a trial created or overwrote, first seen after it), ``notes``.
    """
    base_ok = [t for t in tuner.base_runs if t.status == "ok"]
    pooled = tuner.comparison([base_ok[0].run_dir]) if base_ok else None  # the baseline's runs pooled
    base_summary = pooled["runs"][0] if pooled else None
    rep = (base.report if base else None) or {}
    trials = []
    for o in tuner.outcomes:
        comp = tuner.comparison(o.runs) if o.status == "ok" else None
        runs = [tuner.runs[r] for r in o.runs]
        other = comp["runs"][1] if comp else None
        applied, refusals = _applied([t.report for t in runs])
        first = runs[0] if runs else None
        trials.append({
            "label": plan.label(o.candidate.settings), "settings": o.candidate.settings, "origin": o.candidate.origin,
            "finding": o.candidate.finding,
            "why": o.candidate.why, "predicted": o.candidate.predicted, "status": o.status,
            "detail": first.detail if first else None, "run_dirs": o.runs,
            "samples_per_s": _stats(other).get("samples_per_s"), "steps_per_s": _stats(other).get("steps_per_s"),
            "ci": (_stats(other).get("ci") or {}).get("samples_per_s"),
            "ratio": o.ratio, "ratio_ci": o.ci, "claim": o.claim,
            "basis": comp["comparisons"][0]["basis"] if comp else None,
            "batch_size": o.batch_size, "data_wait_share": (other or {}).get("data_wait_share"),
            "verdict": (other or {}).get("verdict") or ((first.report or {}).get("verdict") if first else None),
            "applied": applied, "not_applied": refusals,
            "outputs_redirected": sorted({o["was"] for t in runs for o in (t.report or {}).get("overrides") or []
                                          if o["name"] == "outputs"}),
            "stopped": first.stopped if first else None, "seconds": round(sum(t.seconds for t in runs), 1),
        })
    # best first; the input ceiling (a measurement, never a setting to adopt) after the trials
    trials.sort(key=lambda t: (t["origin"] == plan.CEILING, t["ratio"] is None, -(t["ratio"] or 0)))
    res = {
        "schema": SCHEMA, "tool_version": whyidle.__version__, "command": list(cmd), "name": default_name(list(cmd)),
        "tune_dir": tuner.root,
        "budget_s": tuner.opts.budget_s, "elapsed_s": round(time.monotonic() - tuner.t0, 1),
        "trial_limit_s": round(tuner.trial_s, 1), "cores": plan.job_cores(rep, limits.own_usable_cores()), "device": rep.get("device"),
        "interrupted": tuner.interrupted,
        "baseline": {
            "run_dirs": [t.run_dir for t in base_ok], "status": base.status if base else "interrupted",
            "detail": base.detail if base else None,
            "samples_per_s": _stats(base_summary).get("samples_per_s"),
            "steps_per_s": _stats(base_summary).get("steps_per_s"),
            "ci": (_stats(base_summary).get("ci") or {}).get("samples_per_s"),
            "batch_size": (base_summary or {}).get("batch_size"),
            "data_wait_share": (base_summary or {}).get("data_wait_share"),
            "verdict": rep.get("verdict"), "findings": [f["id"] for f in rep.get("findings") or []
                                                        if f["severity"] in plan.SEVERE],
        },
        "trials": trials,
        "winner": _winner(tuner, base, win, cmd),
        "batch": _batch(tuner.outcomes),
        "estimates": estimates(trials),
        "input_ceiling": input_ceiling(trials, rep),
        "code_fixes": code_fixes(rep, tuner.outcomes),
        "validation": validation,
        "outputs_changed": changed,
        "notes": _notes(tuner, base, win, trials, changed),
    }
    return res


def winner_patch(cmd: list[str], settings: dict, sites: dict, report: dict) -> dict:
    """The winner's settings as a unified diff of the command's script
    (:func:`whyidle.tune.patch.settings_patch`): ``{diff, file, placed, unplaced, error}`` (``diff``
    None and ``error`` the reason when none could be written)."""
    from whyidle.tune.patch import PatchError, settings_patch

    sites = dict(sites)
    created = ((report.get("loader") or {}).get("created") or [None])[0]
    for k in ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "batch_size"):
        if created and k in settings:
            sites.setdefault(k, created)
    try:
        p = settings_patch(cmd, settings, sites, (report.get("api") or {}).get("name"))
    except PatchError as exc:
        return {"diff": None, "file": None, "placed": {}, "unplaced": {}, "error": str(exc)}
    return {"diff": p.text, "file": p.path, "placed": p.placed, "unplaced": p.unplaced, "error": None}


def first_fix_patch(report: dict, cmd: list[str]) -> dict:
    """``whyidle run --diff``: the first warning/critical finding's printed fix as a diff of the
    script when it is a setting whyidle can apply (:func:`whyidle.tune.plan.candidates`: the
    candidate of that finding that carries its estimate, else its first). Returns
    :func:`winner_patch`'s dict plus ``finding`` and ``settings``; ``error`` says why there is no
    diff (no finding, or its fix is a code change)."""
    first = next((f for f in report.get("findings") or [] if f["severity"] in plan.SEVERE), None)
    if first is None:
        return {"diff": None, "file": None, "placed": {}, "unplaced": {}, "finding": None, "settings": None,
                "error": "no warning or critical finding: nothing to change"}
    cands = [c for c in plan.candidates(report, plan.job_cores(report, limits.own_usable_cores()))
             if c.origin == first["id"]]
    cand = next((c for c in cands if c.predicted is not None), cands[0] if cands else None)
    if cand is None:
        cause = (first.get("evidence") or {}).get("cause")
        what = f"{first['id']}, cause {cause}" if cause else first["id"]
        return {"diff": None, "file": None, "placed": {}, "unplaced": {}, "finding": first["id"], "settings": None,
                "error": f"the first fix ({what}) is a code change, or a setting whyidle does not write as a diff "
                         "(in_order=False, snapshot_every_n_steps): see the report's code"}
    return {**winner_patch(cmd, cand.settings, {}, report), "finding": first["id"], "settings": cand.settings}


def _winner(tuner, base, win, cmd: list[str]) -> dict | None:
    if win is None:
        return None
    from whyidle.pipeline import analyze_run
    from whyidle.tune.code import settings_code

    sites = {}
    for r in win.runs:
        for o in (tuner.runs[r].report or {}).get("overrides") or []:
            if o["applied"] and o.get("site") and ":" in o["site"]:
                sites.setdefault(o["name"], o["site"])
    try:
        code = settings_code(analyze_run(base.run_dir).facts, win.candidate.settings, sites)
    except Exception as exc:  # noqa: BLE001 - the measured result stands without the code
        code = f"# {plan.label(win.candidate.settings)} (code not generated: {exc})"
    comp = tuner.comparison(win.runs)
    return {"label": plan.label(win.candidate.settings), "settings": win.candidate.settings, "ratio": win.ratio,
            "ci": win.ci, "code": code, "statement": comp["comparisons"][0]["statement"] if comp else None,
            "run_dirs": win.runs, "sites": sites,
            "patch": winner_patch(cmd, win.candidate.settings, sites, (base.report if base else None) or {})}


def _batch(outcomes) -> dict | None:
    ladder = [o for o in outcomes if o.candidate.origin == "batch_ladder" or "batch_size" in o.candidate.settings]
    if not ladder:
        return None
    ok = [o for o in ladder if o.ok]
    failed = [o.candidate.settings["batch_size"] for o in ladder if o.status in ("oom", "memory", "failed")]
    ran = [o for o in ladder if o.status != "skipped"]
    rising = bool(ran) and ran[-1].ok and ran[-1].claim == "faster" and len(ran) < len(ladder) and ran[-1] is max(
        ran, key=lambda o: o.ratio or 0)
    stable = max((o.candidate.settings["batch_size"] for o in ok), default=None)
    fastest = max(ok, key=lambda o: o.ratio, default=None)
    return {
        "largest_stable": stable, "failed": failed, "budget_ended": rising,
        "fastest": fastest.candidate.settings["batch_size"] if fastest and fastest.claim == "faster" else None,
        "note": ("A larger batch changes the optimization: re-validate the learning rate and convergence (the "
                 "linear-scaling rule — learning rate × k for a batch k times larger, with warm-up — is a starting "
                 "point, not a promise; Goyal et al. 2017)."),
    }


def estimates(trials: list[dict]) -> list[dict]:
    """Predicted vs measured: each trial that applied a finding's printed fix, with the
    finding's ``est_speedup`` (``predicted``), the measured ratio and ``error`` = predicted ÷
    measured − 1 (positive: whyidle promised too much)."""
    out = []
    for t in trials:
        if t["predicted"] and t["ratio"] and t["status"] == "ok":
            out.append({"finding": t["finding"], "label": t["label"], "predicted": t["predicted"],
                        "measured": t["ratio"], "ci": t["ratio_ci"], "error": t["predicted"] / t["ratio"] - 1})
    return out


def input_ceiling(trials: list[dict], report: dict) -> dict | None:
    """The input pipeline's ceiling (the ``replay`` trial, :data:`whyidle.tune.plan.CEILING`): the
    measured ratio with the DataLoader out of the step, the report's estimate of it
    (``input_bound``'s ``est_speedup_if_removed``), and each input fix's trial held against it.

    Returns ``{label, ratio, ci, claim, status, predicted, fixes: [{label, ratio, of_ceiling}]}``
    (``of_ceiling``: the fix's ratio − 1 over the ceiling's − 1, the part of the reachable gain it
    took; None when the ceiling gains nothing), or None when no ceiling trial ran.
    """
    ceiling = next((t for t in trials if t["origin"] == plan.CEILING), None)
    if ceiling is None:
        return None
    inp = next((f for f in report.get("findings") or [] if f["id"] == "input_bound"), None)
    top = ceiling["ratio"]
    fixes = [{"label": t["label"], "ratio": t["ratio"],
              "of_ceiling": round((t["ratio"] - 1) / (top - 1), 3) if top and top > 1 and t["ratio"] else None}
             for t in trials if t["finding"] == "input_bound" and t["origin"] != plan.CEILING and t["status"] == "ok"]
    return {"label": ceiling["label"], "ratio": top, "ci": ceiling["ratio_ci"], "claim": ceiling["claim"],
            "status": ceiling["status"], "predicted": (inp or {}).get("est_speedup_if_removed"), "fixes": fixes}


def code_fixes(report: dict, outcomes) -> list[dict]:
    """The baseline's warning/critical findings no trial tried: their fix is a code change (or a
    setting whyidle cannot apply in-process). Each ``{finding, severity, title, est_speedup,
    est_speedup_if_removed, fix}`` (``fix``: the printed fix's text), the estimate as the report
    gives it (None: none could be made)."""
    tried = {o.candidate.origin for o in outcomes} | {o.candidate.finding for o in outcomes
                                                       if o.candidate.origin != plan.CEILING}
    return [{"finding": f["id"], "severity": f["severity"], "title": f.get("title"), "est_speedup": f.get("est_speedup"),
             "est_speedup_if_removed": f.get("est_speedup_if_removed"), "fix": (f.get("fix") or {}).get("text")}
            for f in report.get("findings") or [] if f["severity"] in plan.SEVERE and f["id"] not in tried]


def _notes(tuner, base, win, trials, changed) -> list[str]:
    notes = []
    if base is None or base.status != "ok":
        why = {"failed": f"the command failed ({(base.detail if base else '') or 'see output.log'})",
               "oom": "the command ran out of memory", "no_steps": "no training steps were recorded",
               "interrupted": "it was interrupted"}.get(base.status if base else "interrupted", "it did not finish")
        notes.append(f"The baseline run could not be measured: {why}. Nothing was tried.")
    elif not trials:
        notes.append("The diagnosis names no setting whyidle can change without code (its findings' fixes are code "
                     "changes, listed above with their estimates, or nothing holds the step); give settings to try "
                     "with --try NAME=V1,V2.")
    if tuner.interrupted:
        notes.append("Interrupted (Ctrl-C): the results so far.")
    skipped = [t["label"] for t in trials if t["status"] == "skipped"]
    if skipped:
        notes.append(f"The budget ({tuner.opts.budget_s:.0f} s) ran out before {len(skipped)} trial(s): "
                     f"{'; '.join(skipped[:4])}. A larger --budget runs them.")
    if any(t["status"] == "ok" for t in trials) and win is None and base is not None and base.status == "ok":
        notes.append("No trial was measurably faster than the program as written (each interval must clear the "
                     "noise floor): keep its settings.")
    for t in trials:
        for r in t["not_applied"]:
            notes.append(f"{t['label']}: {r['name']} not applied ({r['why']}).")
    modified = sorted({p for c in changed.values() for p in c["modified"]})
    if modified:
        notes.append(f"{len(modified)} file(s) that existed before the tune changed during it ({', '.join(modified[:4])}"
                     f"{' ...' if len(modified) > 4 else ''}): a trial's program wrote them with something other than a "
                     "checkpoint writer whyidle redirects (or another process did); restore them from a copy if they "
                     "matter.")
    created = sorted({p for c in changed.values() for p in c["created"]})
    if created:
        notes.append(f"Trials created {len(created)} file(s) under the working directory ({', '.join(created[:4])}"
                     f"{' ...' if len(created) > 4 else ''}); nothing that existed was changed by them.")
    redirected = sorted({p for t in trials for p in t["outputs_redirected"]})
    if redirected:
        notes.append(f"Checkpoints the program saved ({', '.join(redirected[:3])}{' ...' if len(redirected) > 3 else ''}) "
                     "went to each trial's run directory (outputs/), not to the program's own paths.")
    return notes


def write(res: dict, root: str, json_path: str | None, html_path: str | None) -> None:
    """Writes ``ROOT/tune.json`` and ``ROOT/tune.html`` (and ``--json``/``--html`` copies); a file
    that cannot be written is named in ``notes`` instead."""
    from whyidle.record.writer import write_json_atomic
    from whyidle.report.tune_html import render_html

    targets = [(os.path.join(root, "tune.json"), "json"), (os.path.join(root, "tune.html"), "html")]
    targets += [(p, "json") for p in [json_path] if p and p != "-"] + [(p, "html") for p in [html_path] if p]
    for path, kind in targets:
        try:
            if kind == "json":
                write_json_atomic(path, res)
            else:
                from whyidle.record.writer import atomic_file

                with atomic_file(path) as f:
                    f.write(render_html(res).encode())
        except OSError as exc:
            res["notes"].append(f"{path} could not be written ({exc.strerror or exc}).")
