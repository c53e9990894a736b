"""The interface between the sampler loop and each sampler (host, GPU).

A poller is polled from one background thread of the whyidle process (never the trainer), on its
own period. It returns plain JSON-serializable records (dicts with a ``k`` key, see
``docs/run-format.md``); the loop appends them to ``RUN_DIR/<name>.jsonl``. A poller never raises
for a missing feature: it returns fewer keys or ``None`` values instead. If ``poll`` raises anyway,
the loop disables that poller and records one notice.
"""

from __future__ import annotations

from typing import Protocol


class Poller(Protocol):
    """One sampler driven by :class:`whyidle.sampling.loop.SamplerLoop`.

    Attributes:
        name: file stem of its records (``"host"`` writes ``host.jsonl``).
        period_s: seconds between polls.
    """

    name: str
    period_s: float

    def start(self, now_ns: int) -> list[dict]:
        """Called once before the first poll; returns static records (e.g. ``host_static``).

        Args:
            now_ns: ``time.monotonic_ns()`` at the call.
        """

    def poll(self, now_ns: int) -> list[dict]:
        """Returns the records of one tick (may be empty). ``now_ns`` as in :meth:`start`."""

    def close(self) -> None:
        """Releases handles (e.g. ``nvmlShutdown``). Must not raise."""


class SamplerStopped(Exception):
    """Raised by a poller's ``start`` or ``poll`` to stop itself for good (e.g. its GPU is lost); the
    loop records ``str(exc)`` as the poller's one ``*_notice`` and closes it."""
