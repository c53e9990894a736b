"""C18: thread oversubscription, autodetected threads x processes x workers (cases.md C18).

Stages: two training processes started together (standing for 2 jobs / ranks on one node): this
script, a launcher that imports only the standard library (as ``torchrun`` is a launcher), starts
``c18_rank.py`` twice with ``--rank 0`` / ``--rank 1`` (``subprocess``), the ranks meet at a file
barrier after set-up, train, and the launcher waits for both (non-zero exit if a rank fails).
Each rank trains the S-MLP (512 -> 1024 -> 1024 -> 10, batch 256, SGD) from a
``DataLoader(num_workers=2)`` whose workers build each sample from 8 synthetic 256-dim frames
with a 256x256 matmul-based feature transform (``tanh(frames @ W)``, then mean- and max-pool ->
512 features). 60 steps per rank (the spec says 80: ``--steps 80`` runs ~14 s faulty).

The loader workers use the ``forkserver`` start method (preloading torch), in both variants: with
``fork``, a worker that runs GNU OpenMP with > 1 thread after its parent already started an
OpenMP pool deadlocks (libgomp is not fork-safe; that is why PyTorch sets 1 thread in workers).
The workers are started (``iter(loader)``) before the ranks' start barrier, so the timed loop
does not include worker start-up.

- faulty: ``OMP_NUM_THREADS=8`` and ``torch.set_num_threads(8)`` in each rank and, via
  ``worker_init_fn``, in each loader worker: 2 ranks x (1 + 2 workers) x 8 = 48 intra-op threads
  on 2 cores.
- fixed:  ``OMP_NUM_THREADS=1`` and 1 thread per rank and per worker (6 threads on 2 cores).

The parent prints the aggregate ``RESULT`` line (samples/s summed over both ranks: total samples /
the longest rank's loop time; ``steps`` is per rank; ``step_time_p50_s`` the median of the ranks'
p50s; ``data_wait_share`` their mean) after echoing each rank's own ``RANK{n} RESULT {...}`` line.

Expected diagnosis (faulty): ``cpu_contention`` (thread oversubscription): runnable threads >>
cores (processes x workers x intra-op threads = 48 on 2), very high voluntary and involuntary
context switches, OpenMP spin/barrier time, CPU ~100 % while throughput is low. Fix:
``OMP_NUM_THREADS`` / ``torch.set_num_threads`` = cores / (processes x workers), 1 in loader workers.

Expected faulty -> fixed throughput ratio: >= 1.5x on 2 cores (measured: see README).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

RANK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c18_rank.py")
WORLD = 2


def kill_groups(procs, sig=signal.SIGKILL):
    """Signal every rank's process group: the rank, its loader workers, its forkserver and its
    resource tracker (a SIGKILLed rank would otherwise leave those behind)."""
    for p in procs:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def groups_alive(procs):
    alive = False
    for p in procs:
        try:
            os.killpg(p.pid, 0)
            alive = True
        except (ProcessLookupError, PermissionError):
            pass
    return alive


def launch(args):
    env = dict(os.environ, OMP_NUM_THREADS="8" if args.variant == "faulty" else "1")
    deadline = time.monotonic() + args.rank_timeout
    procs = []

    def on_signal(signum, frame):
        kill_groups(procs)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with tempfile.TemporaryDirectory(prefix="c18_barrier_") as barrier_dir:
        for rank in range(WORLD):
            cmd = [
                sys.executable,
                RANK_SCRIPT,
                "--variant", args.variant,
                "--steps", str(args.steps),
                "--seed", str(args.seed),
                "--rank", str(rank),
                "--barrier-dir", barrier_dir,
            ]  # fmt: skip
            # each rank leads its own process group, so a timeout or a signal can end it with
            # everything it started
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True))
        outputs = []
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            print(f"ranks still running after {args.rank_timeout:g} s: killed", file=sys.stderr)
            kill_groups(procs)
            for p in procs:
                p.wait()
            return 1
        # ranks exited: give their helpers a moment to go, then make sure nothing is left behind
        grace = time.monotonic() + 5.0
        while groups_alive(procs) and time.monotonic() < grace:
            time.sleep(0.05)
        kill_groups(procs)

    results, failed = [], False
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        sys.stdout.write(out)
        line = next((ln for ln in out.splitlines() if ln.startswith(f"RANK{rank} RESULT ")), None)
        if p.returncode != 0 or line is None:
            print(f"rank {rank} failed (exit code {p.returncode})", file=sys.stderr)
            failed = True
        else:
            results.append(json.loads(line.split("RESULT ", 1)[1]))
    sys.stdout.flush()
    if failed:
        return 1

    wall = max(r["wall_s"] for r in results)
    samples = sum(r["samples"] for r in results)
    agg = {
        "steps": min(r["steps"] for r in results),
        "wall_s": wall,
        "samples_per_s": round(samples / wall, 2),
        "step_time_p50_s": round(statistics.median(r["step_time_p50_s"] for r in results), 5),
        "data_wait_share": round(sum(r["data_wait_share"] for r in results) / len(results), 4),
        "samples": samples,
        "scenario": "c18_thread_oversubscription",
        "variant": args.variant,
        "ranks": WORLD,
        "threads_per_process": results[0]["threads"],
        "per_rank_samples_per_s": [r["samples_per_s"] for r in results],
    }
    print("RESULT " + json.dumps(agg), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--variant", choices=("faulty", "fixed"), default="faulty")
    p.add_argument("--fixed", dest="variant", action="store_const", const="fixed", help="same as --variant fixed")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per rank (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank-timeout", type=float, default=300.0, help="kill the ranks after this many seconds")
    return launch(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
