"""Timing helpers shared by the Keras scenario scripts (imported after ``keras``, so a script can
pick its backend first). The scripts themselves are plain Keras programs; whyidle is not used."""

import time

import keras


class StepTimer(keras.callbacks.Callback):
    """Wall time between consecutive batch ends, skipping the first ``skip`` (tracing, warm-up).
    ``async_safe``: where Keras runs batch-end callbacks in its own threads (JAX, torch) it keeps
    doing so, and a batch end is then seen once the step's logs are computed (JAX dispatches steps
    asynchronously: the loop's own pace is not the training's)."""

    async_safe = True

    def __init__(self, skip=3):
        super().__init__()
        self.skip = skip
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def result(self, batch_size):
        """(samples/s, seconds per step) over the steady steps."""
        ends = self.ends[self.skip:] if len(self.ends) > self.skip + 1 else self.ends
        steady = (ends[-1] - ends[0]) / max(1, len(ends) - 1)
        return batch_size / steady, steady


def interleaved(step, it, steps):
    """``next(it)`` then the compiled ``step`` on that batch, as ``fit`` interleaves them, ``steps``
    times: (seconds in ``next`` per batch, seconds per loop iteration)."""
    waits, t_step = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        step(batch)["loss"].numpy()
        waits.append(t1 - t0)
        t_step.append(time.perf_counter() - t0)
    return waits, t_step
