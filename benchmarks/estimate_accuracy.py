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
    args = ap.parse_args()
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
