"""burn.py N SECONDS: start N busy pure-Python processes that spin for SECONDS, then exit.

Stand-ins for unrelated jobs on the same machine (other users' work, a stray data-prep job),
used with ``contention.py``: the test starts ``burn.py`` *outside* the observed command, so the
burners are not in the observed process tree, only on the same cores.

The parent waits for its burners; SIGTERM/SIGINT to the parent stops them all. Each burner also
exits on its own when SECONDS have passed or when its parent has gone (checked every ~1-2 ms), so
a killed parent never leaves spinners behind for long.
"""

import multiprocessing as mp
import os
import signal
import sys
import time


def spin(seconds: float, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    end = time.monotonic() + seconds
    x = 0
    while True:
        for i in range(20000):  # ~1-2 ms of pure-Python arithmetic between checks
            x = (x * 31 + i) % 1000003
        if time.monotonic() >= end or os.getppid() != parent:
            return


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: burn.py N SECONDS", file=sys.stderr)
        return 2
    n, seconds = int(sys.argv[1]), float(sys.argv[2])
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=spin, args=(seconds, os.getpid()), daemon=True) for _ in range(n)]

    def stop(signum, frame):
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=2)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for p in procs:
        p.start()
    print(f"burn: {n} burners for {seconds:g} s: pids " + " ".join(str(p.pid) for p in procs), flush=True)
    for p in procs:
        p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
