"""Run the scenario scripts plainly (no whyidle) several times and summarise their RESULT lines.

    python tests/scenarios/measure.py                  # every scenario, 5 repeats
    python tests/scenarios/measure.py -n 3 c01 c12     # names are matched as prefixes
    python tests/scenarios/measure.py --json out.jsonl # also keep every run

Faulty and fixed runs alternate inside each repeat, so a noisy neighbour hits both about alike;
the ratio column is the median of the per-repeat faulty -> fixed ratios (samples/s), with the
smallest one beside it. ``contention`` is run without and with ``burn.py 2`` (2 busy processes on
the machine, outside the measured command). This is the script behind the README table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (script, [(label, extra args)]); "@burn": run with ``burn.py 2`` alongside
TWO = [("faulty", ["--variant", "faulty"]), ("fixed", ["--variant", "fixed"])]
SCENARIOS = {
    "c01_too_few_workers": ("c01_too_few_workers.py", TWO),
    "c07_tokenize_on_the_fly": ("c07_tokenize_on_the_fly.py", TWO),
    "c11_progress_logging": ("c11_progress_logging.py", TWO),
    "c12_python_loop_loss": ("c12_python_loop_loss.py", TWO),
    "c18_thread_oversubscription": ("c18_thread_oversubscription.py", TWO),
    "main_loader_cpu": ("main_loader_cpu.py", TWO),
    "slow_storage": ("slow_storage.py", TWO),
    "compute_heavy": ("compute_heavy.py", [("healthy", [])]),
    "logging_loop": ("logging_loop.py", TWO),
    "batch1": ("batch1.py", TWO),
    "contention": ("contention.py", [("faulty", ["@burn"]), ("fixed", [])]),
    # framework scenarios (issue 12): rates are steady-state (first 5 steps left out), see fw_meter.py
    "lightning_metric_loop": ("lightning_metric_loop.py", TWO),
    "lightning_input": ("lightning_input.py", TWO),
    "hf_trainer_input": ("hf_trainer_input.py", TWO),
    "accelerate_accum": ("accelerate_accum.py", TWO),
    "plain_accum": ("plain_accum.py", TWO),
    "compiled_model": ("compiled_model.py", [("compiled", [])]),
    # time outside the step (issue 14): samples/s over the whole training loop, process time beside it
    **{f"job_{kind}": ("job_parts.py", [(v, ["--kind", kind, "--variant", v, *extra]) for v in ("faulty", "fixed")])
       for kind, extra in (("eval", []), ("eval_metric", []), ("checkpoint", ["--steps", "150"]),
                           ("epoch", ["--steps", "24"]), ("logging", ["--steps", "60"]))},
    "lightning_eval": ("lightning_eval.py", TWO),
    "module_loop": ("module_loop.py", TWO),
    "loss_loop": ("loss_loop.py", TWO),
    "emulated_bf16": ("emulated_bf16.py", TWO),
    "c36_preprocess_in_forward": ("c36_preprocess_in_forward.py", TWO),
    "c34_many_tiny_tensors": ("c34_many_tiny_tensors.py", TWO),
    "c26_watch_hooks": ("c26_watch_hooks.py", TWO),
    "keras_eval_callback": ("keras_eval_callback.py", TWO),
    # the fixed variant's first launch makes its cache (in the temp folder): run it once before
    "startup_prep": ("startup_prep.py", TWO),
    # inside the DataLoader (issue 36)
    "loader_head_of_line": ("loader_head_of_line.py", TWO + [("prefetch", ["--variant", "prefetch"])]),
    "collate_in_loop": ("collate_in_loop.py", TWO),
    "lists_unpickle": ("lists_unpickle.py", TWO),
    "iterable_uneven": ("iterable_uneven.py", TWO),
    "stateful_snapshot": ("stateful_snapshot.py", TWO),
}


def run_once(script, extra, timeout=120):
    burner = None
    if "@burn" in extra:
        extra = [a for a in extra if a != "@burn"]
        burner = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "burn.py"), "2", str(timeout)], stdout=subprocess.DEVNULL
        )
        time.sleep(0.5)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, os.path.join(HERE, script), *extra],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        if burner is not None:
            burner.terminate()
            burner.wait()
    total = time.perf_counter() - t0
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{script} {extra}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    res = json.loads(line[len("RESULT ") :])
    res["process_s"] = round(total, 2)
    for key in ("step_time_p50_s", "data_wait_share"):  # not every script measures these (nan: not measured)
        res.setdefault(key, float("nan"))
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*")
    p.add_argument("-n", "--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    names = [n for n in SCENARIOS if not args.names or any(n.startswith(a) for a in args.names)]
    out = open(args.json, "a") if args.json else None
    runs = {}  # (name, label) -> list of results
    for rep in range(args.repeats):
        for name in names:
            script, variants = SCENARIOS[name]
            order = variants if rep % 2 == 0 else variants[::-1]
            for label, extra in order:
                res = run_once(script, extra)
                res.update(repeat=rep, name=name, label=label)
                runs.setdefault((name, label), []).append(res)
                if out:
                    out.write(json.dumps(res) + "\n")
                    out.flush()
                print(
                    f"[{rep}] {name:28s} {label:7s} {res['samples_per_s']:>10.1f} samples/s  "
                    f"p50 {res['step_time_p50_s'] * 1000:7.2f} ms  data {res['data_wait_share']:.2f}  "
                    f"loop {res['wall_s']:.2f} s  process {res['process_s']:.1f} s",
                    flush=True,
                )

    print("\nsummary (medians over %d repeats)" % args.repeats)
    for name in names:
        _, variants = SCENARIOS[name]
        for label, _ in variants:
            rs = runs[(name, label)]
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            print(
                f"{name:28s} {label:7s} {med('samples_per_s'):>10.1f} samples/s  "
                f"p50 {med('step_time_p50_s') * 1000:7.2f} ms  "
                f"data {med('data_wait_share'):.2f}  loop {med('wall_s'):.2f} s  process {med('process_s'):.1f} s "
                f"(max {max(r['process_s'] for r in rs):.1f})"
            )
        if len(variants) == 2:
            f, x = runs[(name, "faulty")], runs[(name, "fixed")]
            ratios = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(f, x)]
            print(
                f"{name:28s} ratio fixed/faulty: median {statistics.median(ratios):.2f}x  "
                f"min {min(ratios):.2f}x  all {[round(r, 2) for r in ratios]}"
            )


if __name__ == "__main__":
    main()
