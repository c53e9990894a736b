"""How many batches a multi-worker DataLoader had ready when the training loop asked for the next
one (issue 36, part 2; standard library only; runs on the training thread).

Read at the start of the ``__next__`` calls whyidle times (every call where batches mark the
steps, the fetches of the steps recorded in full otherwise: an unbiased sample), from the
iterator's own state, without a lock: the batches received and held for order
(``_task_info`` entries that carry their data), the batches waiting in the data queue (a
``multiprocessing`` queue's size is its semaphore's value; ``pin_memory``'s thread queue, the length
of its deque), the tasks outstanding (``_tasks_outstanding``: sent to the workers and not yet
returned to the loop) and the most there can be (``_prefetch_factor × _num_workers``). Read for
producer and consumer: no batch ready means the loop waits on the workers (they are the producer
that holds the job); batches ready up to the cap means the loader is ahead and the time is
elsewhere.
"""

from __future__ import annotations

import time

#: The record of the counts (``proc-<pid>.jsonl``, docs/run-format.md).
RECORD_KIND = "loader_queue"


def _held(it) -> int:
    """Batches iterator ``it`` received and holds for order (``_task_info`` entries with data)."""
    return sum(1 for v in it._task_info.values() if len(v) == 2)


class QueueTally:
    """``[fetches, wait_ns]`` per ``(loader, cap, ready, outstanding, behind)`` between two flushes
    (a handful of keys)."""

    def __init__(self) -> None:
        self.counts: dict[tuple, list[int]] = {}
        self.open: tuple | None = None  # (state at the fetch's start, its start ns), until done()

    def sample(self, it, loader) -> None:
        """Reads the state of iterator ``it`` of DataLoader ``loader`` (an ``id()``) at the start of
        a fetch; :meth:`done` counts it. A single-process iterator (no ``_tasks_outstanding``) is
        not counted. Raises nothing."""
        self.open = None
        try:
            outstanding = it._tasks_outstanding
            cap = it._prefetch_factor * it._num_workers
        except AttributeError:
            return
        try:
            held = _held(it)
            queue = it._data_queue
            deque = getattr(queue, "queue", None)  # pin_memory: a queue.Queue filled by the pin thread
            waiting = len(deque) if deque is not None else queue.qsize()
        except Exception:  # qsize() is not implemented on macOS
            return
        self.open = ((loader, int(cap), int(held + waiting), int(outstanding)), time.monotonic_ns())

    def done(self, it) -> None:
        """Counts the fetch :meth:`sample` opened on ``it``, now ended (returned or stopped), with
        its wait in nanoseconds and whether later batches are held for order now. Raises nothing."""
        if self.open is None:
            return
        (state, t0), self.open = self.open, None
        wait = time.monotonic_ns() - t0
        try:
            behind = int(_held(it) > 0)
        except Exception:
            behind = 0
        row = self.counts.get(state + (behind,))
        if row is None:
            self.counts[state + (behind,)] = [1, wait]
        else:
            row[0] += 1
            row[1] += wait

    def drain(self) -> list[dict]:
        """``[loader_queue record]`` with the counts since the last drain, or ``[]`` (the agent's
        collector, from the flusher thread)."""
        if not self.counts:
            return []
        counts, self.counts = self.counts, {}
        return [{"k": RECORD_KIND, "t": time.monotonic_ns(),
                 "counts": [[*key, *row] for key, row in sorted(counts.items(), key=lambda kv: str(kv[0]))]}]
