"""Is the data wait the training process's own part of each fetch rather than the workers'?
(issue 36, part 4; pure).

With workers, ``next(loader)`` in the training process still receives each batch: it reads the
pickled batch from the pipe and unpickles it (a Python list of floats is rebuilt element by element;
a tensor crosses in shared memory and is only mapped), and with ``pin_memory`` takes it from the pin
thread. When that, not the workers, holds the wait, more workers cannot help. Two measurements say
so: the training thread's stack samples in the wait (``RunFacts.data_ipc_share``, innermost frames
in :data:`whyidle.analysis.stacks.IPC_LEAVES`), and the loader's queue at the fetches
(:mod:`whyidle.instrument.loader_queue`): batches ready for most of the wait (``empty_wait_share``
small, the queue full) while the loop still waits.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.types import FixOption, fix_option

#: The snapshot interval (steps) the ``StatefulDataLoader`` fix is estimated for: a checkpoint
#: every 100 steps or more is common; the estimate keeps 1/100 of today's snapshot cost.
SNAPSHOT_EVERY = 100


#: Calls that build tensors or arrays out of Python objects, as written on a line of the program
#: (spaces removed): converting a batch that crossed as Python lists.
CONVERTERS = ("torch.tensor(", "torch.as_tensor(", "np.array(", "np.asarray(", "numpy.array(", "numpy.asarray(",
              "torch.FloatTensor(", "torch.LongTensor(")
#: A conversion line counts from this fraction (0–1) of the step time (``HOT_MIN_SHARE`` of
#: diagnose/sample_cost.py: below, rewriting it gains less than run-to-run noise).
CONVERSION_MIN_SHARE = 0.05


def conversion(facts: RunFacts) -> dict | None:
    """The program's line in the step (outside the data wait and the model) that turns a batch of
    Python objects into tensors, when the DataLoader's batches carried no tensor at all
    (``devices.batch_bytes`` 0): ``{site, code, share}`` (``share``: fraction 0–1 of the step
    time), or None. Such a batch is pickled by the workers, rebuilt element by element in the
    training process, then converted: returning tensors from the Dataset removes both."""
    if (facts.devices or {}).get("batch_bytes") != 0:
        return None
    for h in (facts.hotspots or {}).get("other", []):
        if h.get("library") or h.get("framework"):
            continue
        for line in h.get("lines") or [h]:
            code = (line.get("code") or "").replace(" ", "")
            if (line.get("share") or 0) >= CONVERSION_MIN_SHARE and any(c in code for c in CONVERTERS):
                return {"site": line.get("site"), "code": line.get("code"), "share": round(line["share"], 4)}
    return None


def conversion_text(conv: dict) -> str:
    """The fix for :func:`conversion`'s line, as a sentence."""
    return (f"The batches arrive as Python lists (no tensor in them) and `{conv['code'].strip()}` ({conv['site']}) "
            "converts them in every step: return tensors or NumPy arrays from the Dataset's __getitem__ (and keep "
            "the default collate_fn), so the batch is built once in the workers and crosses in shared memory.")


def received_share(facts: RunFacts) -> float:
    """The fraction (0–1) of the step the training process spends receiving and unpickling batches
    from its workers (data-wait share × ``data_ipc_share``; 0 without workers or stack samples):
    what returning tensors removes besides the step's :func:`conversion`."""
    if not (facts.loader or {}).get("num_workers") or not facts.step:
        return 0.0
    return facts.step["shares"]["data_wait"] * (facts.data_ipc_share or 0.0)


def main_process(facts: RunFacts) -> dict | None:
    """The training process's own reading of the run's data wait, or None when the workers hold it.

    It holds when the training thread spends ``T.IPC_SHARE_OF_WAIT`` or more of its wait receiving
    and unpickling batches (``RunFacts.data_ipc_share``) or in torchdata's ``StatefulDataLoader``
    snapshots (``data_snapshot_share``), or when batches were ready for most of the wait (the
    queue's ``empty_wait_share`` < ``T.RECEIVE_MAX_EMPTY_WAIT`` and ``full_share`` ≥
    ``T.RECEIVE_MIN_FULL``).

    ``part`` says what the training process does: ``"snapshot"`` (a ``StatefulDataLoader``: its
    snapshots' bookkeeping, and the receiving too when the batches carry tensors: then what crosses
    besides them is the workers' dataset state, pickled with each batch at every snapshot),
    ``"objects"`` (batches of Python objects, no tensor in them: unpickled element by element, and
    converted in the step where :func:`conversion` finds the line), else ``"receive"`` (tensor
    batches whose receiving still holds the wait: no estimate, the fix depends on what they carry).

    Returns ``{part, share, est, conversion, ready_mean, cap, full_share, reason}``: ``share``
    (0–1 of the wait in that part, None without stack samples), ``est`` (step-time ratio with it
    gone: objects → tensors, which also removes the conversion; snapshots every
    :data:`SNAPSHOT_EVERY` steps where they are taken more often; None otherwise), the queue's mean
    batches ready, its cap and full share (None without the queue), the summary's sentence.
    """
    step = facts.step or {}
    loader = facts.loader or {}
    nw = loader.get("num_workers") or 0
    if not nw or not step:
        return None
    ipc, snapshot = facts.data_ipc_share or 0.0, facts.data_snapshot_share or 0.0
    q = (facts.loader_workers or {}).get("queue") or {}
    empty, full = q.get("empty_wait_share"), q.get("full_share")
    ready = empty is not None and empty < T.RECEIVE_MAX_EMPTY_WAIT and (full or 0) >= T.RECEIVE_MIN_FULL
    if not ready and max(ipc, snapshot) < T.IPC_SHARE_OF_WAIT:
        return None
    every = loader.get("snapshot_every_n_steps")
    objects = (facts.devices or {}).get("batch_bytes") == 0
    if every and (snapshot > ipc or not objects):
        part, share = "snapshot", snapshot + (0.0 if objects else ipc)
    else:
        part, share = ("objects" if objects else "receive"), ipc
    mean, wait = step["step_time_s"]["mean"], step["data_wait_s_per_step"]
    conv = conversion(facts) if part == "objects" else None
    est = None
    if part == "objects" and share:
        est = mean / max(1e-9, mean - wait * share - (conv["share"] * mean if conv else 0.0))
    elif part == "snapshot" and share and every < SNAPSHOT_EVERY:  # kept: every / SNAPSHOT_EVERY of the cost
        est = mean / max(1e-9, mean - wait * share * (1.0 - every / SNAPSHOT_EVERY))
    queue = (f"{q['ready_mean']:.1f} of {q['cap']} batches were ready when the loop asked (the loader full at "
             f"{full:.0%} of the fetches)") if ready else ""
    doing = {"snapshot": f"it spends {share:.0%} of the wait on StatefulDataLoader's snapshots of the workers' state "
                         f"(snapshot_every_n_steps={every})",
             "objects": f"it spends {share:.0%} of the wait receiving and unpickling batches of Python objects",
             "receive": f"it spends {share:.0%} of the wait receiving the batches"}[part] if share else ""
    converting = (f"then `{conv['code'].strip()}` converts the Python lists in the step ({conv['share']:.0%} of it)"
                  if conv else "")
    reason = ("the wait is the training process's own part of each fetch, not the workers': "
              + "; ".join(p for p in (queue, doing, converting) if p))
    return {"part": part, "share": share, "est": est, "conversion": conv, "ready_mean": q.get("ready_mean"),
            "cap": q.get("cap"), "full_share": full, "every": every, "reason": reason}


def options(receive: dict) -> list[FixOption]:
    """The fix for a wait in the training process's own part of the fetch, with its estimate."""
    est = round(receive["est"], 3) if receive["est"] else None
    ready = " More workers would not help: the batches are ready."
    if receive["part"] == "snapshot":
        every = receive["every"]
        often = every < SNAPSHOT_EVERY
        return [fix_option(
            ("Snapshot the loader's state only as often as you checkpoint: StatefulDataLoader(..., "
             f"snapshot_every_n_steps=<checkpoint interval in steps>) (now {every}: "
             + ("every batch" if every == 1 else f"every {every} batches") + "), and keep the dataset's state_dict() "
             "small (counters and offsets, not arrays): the workers' state crosses to the training process with "
             "the batches at every snapshot." if often else
             "Keep the dataset's state_dict() small (counters and offsets, not arrays): the workers' state crosses "
             f"to the training process with the batches at every snapshot (every {every} steps).") + ready,
            est, f"estimated for a snapshot every {SNAPSHOT_EVERY} steps; a resumed job restarts from the last "
                 "snapshot" if often else None,
            f"loader = StatefulDataLoader(..., snapshot_every_n_steps={SNAPSHOT_EVERY})   # was {every}"
            if often else None)]
    if receive["part"] == "objects":
        return [fix_option(
            "Return tensors or NumPy arrays from __getitem__ and collate_fn, not Python lists, dicts of lists or other "
            "objects: a tensor crosses to the training process in shared memory and is only mapped there, while a "
            "Python object is pickled by the worker and rebuilt element by element in the training process." + ready,
            est, "its receiving time gone" + (" and the conversion in the step" if receive["conversion"] else "")
            + " (a batch of tensors still costs a shared-memory mapping per tensor)", None)]
    return [fix_option(
        "Look at what each batch carries besides its tensors: Python objects in it (lists, strings, dicts of "
        "metadata) are pickled by the worker and rebuilt in the training process; keep them out of the batch or "
        "make them tensors." + ready, None, None, None)]
