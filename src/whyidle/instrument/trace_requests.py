"""Deep-trace requests as a trainer process sees them (issue 34): the polling and addressing of
``RUN_DIR/control/trace.json`` shared by the PyTorch window (:mod:`whyidle.instrument.deep_trace`)
and the Keras/TensorFlow one (:mod:`whyidle.instrument.tf_deep_trace`).

The parent writes the request atomically (temp file + ``os.replace``)::

    {"id": "t1", "steps": 10, "ranks": null | [int, ...], "pids": null | [int, ...], "reason": "text", "t": ns}

A look (:meth:`Requests.look`) is one ``os.stat``; the file is read only when its
``(mtime_ns, size, inode)`` changed since the last read. The caller looks at most every
:data:`POLL_S` seconds, at its training thread's step boundaries. A request is one to serve when
its ``id`` is a non-empty string this process has not served, it was written after the process
started (``t``, monotonic ns, not before the agent's ``t_start``) and it names this process:
``pids`` null or holding its pid, ``ranks`` null or holding its rank (a process outside a
distributed job counts as rank 0).
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable

#: Seconds between two looks at the control file (one ``os.stat`` each), at step boundaries.
POLL_S = 1.0
POLL_NS = int(POLL_S * 1e9)
#: Steps a request without ``steps`` traces, and the most one may ask for (a window's trace grows
#: with its steps: ~0.4 MB per step for a 30-layer MLP on CPU, far more on a large model).
DEFAULT_STEPS = 10
MAX_STEPS = 200
CONTROL_FILE = os.path.join("control", "trace.json")
TRACES_DIR = "traces"

Place = Callable[[], "tuple[int | None, int | None]"]


def launcher_place() -> tuple[int | None, int | None]:
    """``(rank, world_size)`` from the launcher's ``RANK`` / ``WORLD_SIZE`` environment variables
    (torchrun, ``accelerate``, MPI wrappers that set them); ``(None, None)`` outside a distributed
    job."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and rank.isdigit():
        return int(rank), int(world) if world is not None and world.isdigit() else None
    return None, None


def steps_of(req: dict) -> int:
    """The steps a request asks for: its ``steps`` when a positive int, at most :data:`MAX_STEPS`,
    else :data:`DEFAULT_STEPS`."""
    steps = req.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
        return min(MAX_STEPS, steps)
    return DEFAULT_STEPS


def reason_of(req: dict) -> str | None:
    """The request's ``reason`` when a string, else None."""
    reason = req.get("reason")
    return reason if isinstance(reason, str) else None


def trace_name(req_id: str, rank: int | None, pid: int) -> str:
    """The name of a window's trace under ``RUN_DIR/traces``: ``<id>-rank<R>-<pid>`` (no rank part
    outside a distributed job); the id is cut to 64 characters of ``[A-Za-z0-9_.-]``."""
    rid = re.sub(r"[^A-Za-z0-9_.-]", "_", req_id)[:64]
    return f"{rid}-rank{rank}-{pid}" if rank is not None else f"{rid}-{pid}"


class Requests:
    """The control file of one process's run directory, as that process serves it.

    Args:
        run_dir: the run directory (the control file is ``run_dir/control/trace.json``).
        t_start: monotonic ns when the process started; older requests are not for it.
        place: returns the process's ``(rank, world_size)`` (asked only for a request that names
            ranks).
    """

    def __init__(self, run_dir: str, t_start: int, place: Place = launcher_place) -> None:
        self.path = os.path.join(run_dir, CONTROL_FILE)
        self.t_start = t_start
        self.place = place
        self.seen: tuple | None = None  # (mtime_ns, size, inode) of the control file last read
        self.served: set[str] = set()

    def look(self) -> dict | None:
        """The control file's request when the file changed since the last look and the request
        is one to serve (module docstring), else None. One ``os.stat``; a read only on a change.
        The caller marks it served (:meth:`serve`). Never raises for a missing, half-written or
        malformed file."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self.seen:
            return None
        self.seen = key
        try:
            with open(self.path, encoding="utf-8") as f:
                req = json.load(f)
        except (OSError, ValueError):
            return None  # being replaced, or not JSON: the next change is read again
        return req if self.addressed(req) else None

    def addressed(self, req) -> bool:
        """Whether ``req`` (the parsed control file) is one this process is to serve now."""
        if not isinstance(req, dict) or not isinstance(req.get("id"), str) or not req["id"]:
            return False
        if req["id"] in self.served:
            return False
        t = req.get("t")
        if isinstance(t, int) and t < self.t_start:
            return False  # written before this process started: meant for those running then
        ranks, pids = req.get("ranks"), req.get("pids")
        if pids is not None and (not isinstance(pids, list) or os.getpid() not in pids):
            return False
        if ranks is not None:
            rank, _ = self.place()
            if not isinstance(ranks, list) or (0 if rank is None else rank) not in ranks:
                return False
        return True

    def serve(self, req: dict) -> int:
        """Marks ``req`` served (its ``id`` is not served again); returns its steps
        (:func:`steps_of`)."""
        self.served.add(req["id"])
        return steps_of(req)
