"""How accurate are whyidle's speed-up estimates? ``whyidle tune`` over scenario scripts.

Each scenario's diagnosis prints a fix with an estimate (``est_speedup``); ``whyidle tune``
applies that fix in a trial and measures it (``estimates`` in ``whyidle.tune/1``: the finding's
prediction beside the measured throughput ratio and its 95 % interval). This script runs ``whyidle
tune`` on each scenario, one at a time, and prints every (predicted, measured) pair and:

- the mean absolute error of the estimates, |predicted − measured| in × (the figure the README
  publishes), and the mean absolute relative error |predicted ÷ measured − 1|;
- for each scenario, the winner and whether it was a measured improvement (never a slower setting).

    flock /tmp/whyidle-timing.lock python benchmarks/estimate_accuracy.py [--budget 150]
        [--scenarios image_decode_main,batch1] [--out /tmp/estimate-accuracy]

Scenarios (``tests/scenarios``; the demo's training script besides): run as written (the faulty
variant); those without a finding whose fix is a setting give no pair but show that tune finds
nothing faster or something real.

``--pairs`` checks the estimates of fixes that need code, against the scenarios' own fixed
variants: the faulty variant once under ``whyidle run`` (the named finding's ``est_speedup``), then
plain runs of the faulty and the fixed variant, alternated (``--repeats`` each), the measured
ratio being the median samples/s the scenario prints itself (its ``RESULT`` line: step terms) or
the median training-loop time it prints, after the first step (``loop``: the whole-job findings of
the loop's periodic parts, whose estimate is a training-loop ratio, ``est_basis``; the first step
holds the workers' first start, start-up to whyidle). The printed fix and the fixed variant may differ in detail (the fixed variant is
what a user wrote); the table names both.

    flock /tmp/whyidle-timing.lock python benchmarks/estimate_accuracy.py --pairs [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCEN = os.path.join(REPO, "tests", "scenarios")

#: name -> the command, as written (faulty variants; enough steps to outlast any trial).
SCENARIOS = {
    "image_decode_main": [os.path.join(SCEN, "image_decode_main.py"), "--steps", "100000"],
    "c01_too_few_workers": [os.path.join(SCEN, "c01_too_few_workers.py"), "--steps", "100000"],
    "slow_storage": [os.path.join(SCEN, "slow_storage.py"), "--steps", "100000"],
    "batch1": [os.path.join(SCEN, "batch1.py"), "--steps", "100000"],
    "workers_slower": [os.path.join(SCEN, "workers_slower.py"), "--steps", "100000"],
    "c03_tfdata_sequential_map": [os.path.join(SCEN, "c03_tfdata_sequential_map.py"), "--steps", "100000"],
    "demo": ["-m", "whyidle.demo.train", "--steps", "100000"],
}


#: name -> (script and its arguments, the fixed variant's arguments in place of ``--variant fixed``
#: where they differ, the finding whose estimate is checked, ``"step"`` or ``"loop"``, the fix).
PAIRS = {
    "loss_loop": (["loss_loop.py", "--steps", "300"], None, "host_bound", "step", "one loss call on the batch"),
    "c12_python_loop_loss": (["c12_python_loop_loss.py", "--steps", "60"], None, "host_bound", "step", "cdist + masked max/min"),
    "c11_progress_logging": (["c11_progress_logging.py"], None, "host_bound", "step", "redraw every 50 steps"),
    "logging_loop": (["logging_loop.py", "--steps", "150"], None, "host_bound", "step", "log every 50 steps"),
    "module_loop": (["module_loop.py", "--steps", "60"], None, "host_bound", "step", "views folded into the batch"),
    "c36_preprocess_in_forward": (["c36_preprocess_in_forward.py", "--steps", "80"], None, "host_bound", "step",
                                  "preprocessing in collate_fn"),
    "main_loader_cpu": (["main_loader_cpu.py", "--steps", "60"], None, "input_bound", "step", "2 workers"),
    "c07_tokenize_on_the_fly": (["c07_tokenize_on_the_fly.py", "--steps", "40"], None, "input_bound", "step",
                                "tokenized once, before training"),
    "slow_storage": (["slow_storage.py", "--steps", "60"], None, "input_bound", "step", "6 workers, prefetch 4"),
    "c34_many_tiny_tensors": (["c34_many_tiny_tensors.py", "--steps", "80"], None, "input_bound", "step",
                              "targets collated into few tensors"),
    "c26_watch_hooks": (["c26_watch_hooks.py", "--steps", "150"], None, "host_bound", "step", "watch every 100 steps"),
    "batch1": (["batch1.py"], None, "small_batch", "step", "batch 64"),
    "small_batch_bf16": (["small_batch_bf16.py", "--steps", "60"], None, "small_batch", "step", "batch 64"),
    "pandas_rows": (["pandas_rows.py", "--steps", "60"], None, "input_bound", "step", "columns converted once"),
    "randaugment_pil": (["randaugment_pil.py", "--steps", "60"], None, "input_bound", "step",
                        "batch tensor augmentation"),
    "stream_parse": (["stream_parse.py", "--steps", "60"], ["--cached"], "input_bound", "step", "parsed once"),
    "respawn_workers": (["respawn_workers.py", "--steps", "96"], None, "epoch_boundary", "loop",
                        "persistent_workers=True"),
    "job_parts_eval": (["job_parts.py", "--kind", "eval", "--steps", "40"], None, "eval_bound", "loop",
                       "evaluate every 40 steps"),
    "job_parts_checkpoint": (["job_parts.py", "--kind", "checkpoint", "--steps", "150"], None, "checkpoint_bound",
                             "loop", "save every 50 steps"),
    "job_parts_epoch": (["job_parts.py", "--kind", "epoch", "--steps", "24"], None, "epoch_boundary", "loop",
                        "persistent_workers=True"),
}


#: name -> the fix option the fixed variant applies, when it is not the printed (first) one: a
#: word of its text or code (case-insensitive); its own ``est_speedup`` is the prediction.
OPTION = {"main_loader_cpu": "num_workers", "randaugment_pil": "cheaper", "stream_parse": "cheaper",
          "c07_tokenize_on_the_fly": "cheaper", "pandas_rows": "cheaper"}


def _option(found: dict, word: str | None) -> dict:
    """The finding's fix option holding ``word`` (the printed fix for None or no match)."""
    fix = found.get("fix") or {}
    for o in fix.get("options") or []:
        if word and word.lower() in ((o.get("text") or "") + (o.get("code") or "")).lower():
            return o
    return {"text": fix.get("text"), "est_speedup": found.get("est_speedup")}


def _plain(cmd: list[str]) -> tuple[float | None, float | None]:
    """(samples/s, training-loop seconds after the first step) from the scenario's RESULT line
    (None, None without one)."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:3])}: exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    res = json.loads(line[7:]) if line else {}
    loop = res.get("wall_s") - (res.get("first_step_s") or 0.0) if res.get("wall_s") else None
    return res.get("samples_per_s"), loop


def pair(name: str, repeats: int, out: str) -> dict:
    """One scenario's (predicted, measured) pair: see the module docstring (``--pairs``)."""
    import statistics

    args, fixed_args, fid, basis, fix = PAIRS[name]
    faulty = [sys.executable, os.path.join(SCEN, args[0]), *args[1:]]
    fixed = faulty + (fixed_args or ["--variant", "fixed"])
    report_path = os.path.join(out, f"{name}.json")
    subprocess.run([sys.executable, "-m", "whyidle", "run", "-q", "--no-html", "--out", os.path.join(out, name),
                    "--json", report_path, "--", *faulty], capture_output=True, text=True)
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    found = next((f for f in report["findings"] if f["id"] == fid and f["severity"] != "info"), None)
    runs = {"faulty": [], "fixed": []}
    for _ in range(repeats):
        for variant, cmd in (("faulty", faulty), ("fixed", fixed)):
            runs[variant].append(_plain(cmd))
    k = 0 if basis == "step" else 1
    if not all(r[k] for r in runs["faulty"] + runs["fixed"]):
        raise RuntimeError(f"{name}: no RESULT line")
    if basis == "step":
        measured = statistics.median(r[0] for r in runs["fixed"]) / statistics.median(r[0] for r in runs["faulty"])
    else:  # the same steps in less time
        measured = statistics.median(r[1] for r in runs["faulty"]) / statistics.median(r[1] for r in runs["fixed"])
    option = _option(found, OPTION.get(name)) if found else {}
    return {"name": name, "finding": fid, "verdict": report.get("verdict"), "basis": basis, "fix": fix,
            "severity": found["severity"] if found else None,
            "predicted": option.get("est_speedup"),
            "ceiling": (found.get("evidence") or {}).get("est_speedup_if_removed") if found else None,
            "printed_fix": (option.get("text") or "")[:80] if found else None,
            "first": bool(found) and option.get("text") == (found.get("fix") or {}).get("text"),
            "measured": measured}


def pairs_main(names: list[str], repeats: int, out: str) -> int:
    os.makedirs(out, exist_ok=True)
    rows = []
    print("| scenario | finding (verdict) | fixed variant | its fix option (* printed first) | predicted | measured | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        try:
            r = pair(name, repeats, out)
        except (RuntimeError, OSError, ValueError) as e:
            print(f"| {name} | failed: {e} | | | | | |")
            continue
        err = "" if r["predicted"] is None else f"{r['predicted'] / r['measured'] - 1:+.0%}"
        pred = "none" if r["predicted"] is None else f"{r['predicted']:.2f}×"
        print(f"| `{name}` | `{r['finding']}` {r['severity'] or 'not found'} ({r['verdict']}) | {r['fix']} | "
              f"{'*' if r['first'] else ''}{r['printed_fix'] or ''} | {pred} | {r['measured']:.2f}× ({r['basis']}) | {err} |", flush=True)
        rows.append(r)
    scored = [r for r in rows if r["predicted"]]
    if scored:
        mare = sum(abs(r["predicted"] / r["measured"] - 1) for r in scored) / len(scored)
        worst = max(scored, key=lambda r: max(r["predicted"] / r["measured"], r["measured"] / r["predicted"]))
        print(f"\nmean absolute relative error {mare:.0%} over {len(scored)} estimate(s); without an estimate: "
              f"{len(rows) - len(scored)}; furthest: {worst['name']} ({worst['predicted']:.2f}× vs "
              f"{worst['measured']:.2f}×)")
    return 0


def _demo_data() -> str:
    from whyidle.demo.data import ensure_images

    return ensure_images(None)[0]


def run(name: str, budget: float, out: str) -> dict:
    cmd = [sys.executable] + SCENARIOS[name]
    if name == "demo":
        cmd += ["--data", _demo_data()]
    tune_dir = os.path.join(out, name)
    shutil.rmtree(tune_dir, ignore_errors=True)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "whyidle", "tune", "--budget", str(budget), "--out", tune_dir,
                           "--json", "-", "--", *cmd], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1):
        return {"name": name, "error": (proc.stderr.strip().splitlines() or ["?"])[-1], "wall_s": wall}
    res = json.loads(proc.stdout)
    return {"name": name, "res": res, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=150.0, help="whyidle tune --budget per scenario (s)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", default="/tmp/estimate-accuracy")
    ap.add_argument("--pairs", action="store_true", help="check code fixes against the scenarios' fixed variants")
    ap.add_argument("--repeats", type=int, default=2, help="--pairs: plain runs of each variant")
    args = ap.parse_args()
    if args.pairs:
        names = [n for n in args.scenarios.split(",") if n in PAIRS] if args.scenarios != ",".join(SCENARIOS) else list(PAIRS)
        return pairs_main(names, args.repeats, args.out)
    names = [n for n in args.scenarios.split(",") if n]
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# estimate accuracy · commit {commit} · budget {args.budget:.0f} s per scenario · load {os.getloadavg()[0]:.2f}")
    pairs = []
    for name in names:
        r = run(name, args.budget, args.out)
        if "error" in r:
            print(f"{name}: tune failed: {r['error']}")
            continue
        res = r["res"]
        base, win = res["baseline"], res["winner"]
        print(f"\n## {name}  (verdict {base['verdict']}, {len(res['trials'])} trials, {res['elapsed_s']:.0f} s of "
              f"{res['budget_s']:.0f} s, wall {r['wall_s']:.0f} s)")
        for t in res["trials"]:
            ratio = "—" if t["ratio"] is None else f"{t['ratio']:.2f}×" + (
                f" [{t['ratio_ci'][0]:.2f}–{t['ratio_ci'][1]:.2f}]" if t["ratio_ci"] else "")
            pred = f"  predicted {t['predicted']:.2f}×" if t["predicted"] else ""
            print(f"  {t['label']:<70} {ratio:<22} {t['claim'] if t['status'] == 'ok' else t['status']}{pred}")
        print(f"  winner: {win['label'] + ' ' + format(win['ratio'], '.2f') + '×' if win else 'none (keep as written)'}")
        for e in res["estimates"]:
            pairs.append((name, e))
    print("\n## Estimates: predicted vs measured")
    print("| scenario | finding | fix tried | predicted | measured [95 % CI] | error |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, e in pairs:
        ci = f" [{e['ci'][0]:.2f}–{e['ci'][1]:.2f}]" if e["ci"] else ""
        print(f"| {name} | {e['finding']} | {e['label']} | {e['predicted']:.2f}× | {e['measured']:.2f}×{ci} | "
              f"{e['predicted'] - e['measured']:+.2f}× |")
    if pairs:
        mae = sum(abs(e["predicted"] - e["measured"]) for _, e in pairs) / len(pairs)
        mare = sum(abs(e["predicted"] / e["measured"] - 1) for _, e in pairs) / len(pairs)
        print(f"\nmean absolute error: {mae:.2f}× over {len(pairs)} estimate(s); mean absolute relative error "
              f"{mare:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
