"""Fuzz whyidle's readers for longer than CI does: damaged run directories, compared runs and traces.

The same mutation fuzzer as ``tests/test_fuzz.py`` (``tests/fuzzing.py``): copies of the recorded
runs in ``tests/data/runs``, a synthetic trace and the real traces of ``../shared/traces`` (when
present, those up to ``--max-trace-mb`` of JSON), damaged (truncated, bits flipped, junk, invalid
UTF-8, lines duplicated/dropped/swapped, giant strings, deep nesting, wrong types, huge numbers,
NaN/inf, negative durations, deleted fields, shuffled events, gzip damage) and given to
``whyidle report``, ``whyidle compare`` and ``whyidle trace`` in this process. The contract: a report
(strict JSON) or one ``whyidle: <path>: ...`` line with exit 2, never a traceback nor an
unexpected exception told in one line.

Prints, per kind: inputs tried, reports written, one-line refusals, contract failures (with the
first few, and the input files of each failure kept under ``--keep``), inputs per second.

    python benchmarks/fuzz.py --cases 2000 --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import fuzzing  # the tests' fuzzer (tests/ put on sys.path above)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="inputs per kind (default 1000)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default="run,compare,trace", help="comma-separated: run, compare, trace")
    ap.add_argument("--max-trace-mb", type=float, default=8.0, help="largest real trace to mutate (MB of JSON)")
    ap.add_argument("--keep", default="/tmp/whyidle-fuzz-failures", help="where failing inputs are copied")
    ap.add_argument("--examples", type=int, default=0,
                    help="also run the schema property test (tests/test_fuzz.py) with this many examples")
    args = ap.parse_args()
    runs = sorted(os.path.join(REPO, "tests", "data", "runs", d) for d in os.listdir(os.path.join(REPO, "tests", "data", "runs")))
    seeds = fuzzing.seed_traces(int(args.max_trace_mb * (1 << 20)))
    total_fail = 0
    print(f"seeds: {len(runs)} run directories, {len(seeds)} traces; seed {args.seed}")
    print(f"{'kind':8} {'inputs':>7} {'reports':>8} {'refused':>8} {'failures':>9} {'inputs/s':>9}")
    for kind in args.kinds.split(","):
        rng = random.Random(f"{args.seed}-{kind}")
        work = tempfile.mkdtemp(prefix=f"whyidle-fuzz-{kind}-")
        counts = {0: 0, 2: 0}
        failures = []
        t0 = time.perf_counter()
        for i in range(args.cases):
            if kind == "run":
                o = fuzzing.fuzz_run_dir(rng.choice(runs), work, rng)
            elif kind == "compare":
                o = fuzzing.fuzz_compare(runs, work, rng)
            else:
                name, text = rng.choice(seeds)
                o = fuzzing.fuzz_trace(text, name, work, rng)
            counts[o.exit_code] = counts.get(o.exit_code, 0) + 1
            if o.problem:
                failures.append((i, o))
                shutil.copytree(work, os.path.join(args.keep, f"{kind}-{i}"), dirs_exist_ok=True)
        dt = time.perf_counter() - t0
        shutil.rmtree(work, ignore_errors=True)
        total_fail += len(failures)
        print(f"{kind:8} {args.cases:7d} {counts.get(0, 0):8d} {counts.get(2, 0):8d} {len(failures):9d} "
              f"{args.cases / dt:9.1f}")
        for i, o in failures[:5]:
            print(f"  case {i}: {o.what[:160]}\n    {o.problem.splitlines()[0][:200]}")
    if args.examples:
        import subprocess

        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              os.path.join(REPO, "tests", "test_fuzz.py"), "-k", "keeps_can_be_reported"],
                             env={**os.environ, "WHYIDLE_FUZZ_EXAMPLES": str(args.examples)}, cwd=REPO)
        print(f"schema property: {args.examples} examples in {time.perf_counter() - t0:.0f} s: "
              f"{'passed' if rc == 0 else 'FAILED'}")
        total_fail += rc != 0
    if total_fail:
        print(f"failing inputs kept under {args.keep}")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
