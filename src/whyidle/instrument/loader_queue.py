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


class QueueTally:
    """Counts of ``(loader, cap, ready, outstanding)`` between two flushes (a handful of keys)."""

    def __init__(self) -> None:
        self.counts: dict[tuple, int] = {}

    def sample(self, it, loader) -> None:
        """Counts the state of iterator ``it`` of DataLoader ``loader`` (an ``id()``) now; a
        single-process iterator (no ``_tasks_outstanding``) is not counted. Raises nothing."""
        try:
            outstanding = it._tasks_outstanding
            cap = it._prefetch_factor * it._num_workers
        except AttributeError:
            return
        try:
            held = sum(1 for v in it._task_info.values() if len(v) == 2)
            queue = it._data_queue
            deque = getattr(queue, "queue", None)  # pin_memory: a queue.Queue filled by the pin thread
            waiting = len(deque) if deque is not None else queue.qsize()
        except Exception:  # qsize() is not implemented on macOS
            return
        key = (loader, int(cap), int(held + waiting), int(outstanding))
        self.counts[key] = self.counts.get(key, 0) + 1

    def drain(self) -> list[dict]:
        """``[loader_queue record]`` with the counts since the last drain, or ``[]`` (the agent's
        collector, from the flusher thread)."""
        if not self.counts:
            return []
        counts, self.counts = self.counts, {}
        return [{"k": RECORD_KIND, "t": time.monotonic_ns(),
                 "counts": [[*key, n] for key, n in sorted(counts.items(), key=lambda kv: str(kv[0]))]}]
