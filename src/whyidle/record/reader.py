"""Readers of a run directory (format in ``docs/run-format.md``).

Readers skip what they cannot use and say so (``RunData.problems``): a truncated last line (a write
cut short by a kill), damaged lines, records whose fields have unusable values
(:mod:`whyidle.record.schema`), a ``meta.json`` that is not JSON when records are there. Input that
holds nothing usable is a :class:`RunDirError` with a one-line message naming the file.
"""

from __future__ import annotations

import bisect
import dataclasses
import glob
import json
import math
import os
import re

from whyidle.cmdline import program_and_script
from whyidle.record import cells, compact, marks, schema, stepdecode
from whyidle.record.loader_workers import read_loader_files
from whyidle.record.steptable import StepTable
from whyidle.redact import redact_argv


class RunDirError(Exception):
    """The run directory is missing, empty or corrupt; ``str(err)`` is a one-line explanation."""


@dataclasses.dataclass
class RunData:
    """Everything recorded in one run directory, as plain records.

    Attributes:
        path: the run directory.
        meta: ``meta.json`` (empty dict if it was never written).
        host: records of ``host.jsonl``.
        gpu: records of ``gpu.jsonl``.
        procs: pid → records of ``proc-<pid>.jsonl`` other than steps.
        steps: pid → that file's ``step`` records (and GPU step times) as a :class:`StepTable`.
        problems: readable notes about skipped damage (e.g. a truncated last line).
        windows: ``window`` records of ``windows.jsonl`` (the rolling diagnosis), in time order.
        deep_traces: ``deep_trace`` records of ``traces.jsonl`` (deep traces taken during the run).
        summaries: pid → the :class:`~whyidle.record.rank_summary.RankSummary` read instead of
            its ``proc-<pid>.jsonl`` (a merge of node runs, :mod:`whyidle.record.merge`); its
            ``procs`` entry holds the records the summary kept, and ``steps`` has none.
        loader_workers: pid → :class:`~whyidle.record.loader_workers.WorkerTally` of each
            DataLoader worker's ``loader-<pid>.jsonl`` (its batches, summed).
    """

    path: str
    meta: dict
    host: list
    gpu: list
    procs: dict
    problems: list
    steps: dict = dataclasses.field(default_factory=dict)
    windows: list = dataclasses.field(default_factory=list)
    deep_traces: list = dataclasses.field(default_factory=list)
    summaries: dict = dataclasses.field(default_factory=dict)
    loader_workers: dict = dataclasses.field(default_factory=dict)


#: Most ``host`` ticks a report reads of one run (~83 minutes of the sampler's 4 Hz). A longer run
#: is read at one tick in k (k = the ticks in the file ÷ this, rounded up), first and last ticks
#: always: the tick counters are cumulative (CPU, context switches, disk, each process's CPU), so
#: every figure between the ticks read is exact; gauges (memory, RSS, threads) are sampled every k
#: ticks. A day at 4 Hz is 345,600 ticks, ~2.5 KB each once parsed: 860 MB, against 50 MB here.
HOST_TICKS_MAX = 20_000
#: Consecutive step lines decoded at once (:func:`whyidle.record.stepdecode.add_lines`): ~2 MB.
_STEP_BATCH = 4096
#: Fewer consecutive step lines are taken one by one (a 1 kHz run writes one full ``step`` line
#: between ``steps`` records: a decode per column costs more than a typed decode per line there).
_STEP_BATCH_MIN = 16
_HOST_PREFIX = b'{"k":"host",'
_TOP_PREFIX = b'{"k":"host_top",'


def read_jsonl(path: str, steps: "StepTable | None" = None, tick_stride: int = 1,
               stacks_group: int = 1) -> tuple[list[dict], list[str]]:
    """Reads a JSON Lines file, streaming.

    Args:
        path: the file (a missing file reads as empty).
        steps: when given, ``step`` and ``gpu_step`` records go into this table instead of the
            returned list (keeps memory small for long runs).
        tick_stride: read one ``host`` tick in this many (the first, every k-th and the last;
            the others are skipped unparsed: :data:`HOST_TICKS_MAX`), and one ``host_top`` scan
            in this many (the other processes' CPU: a ratio over the scans read).
        stacks_group: ``stacks`` records summed by this many outside the run's first and last
            10 minutes (:class:`whyidle.record.compact.StacksMerger`); returned after the others.
    Returns:
        (records, problems): the parsed objects in file order; problems lists skipped damage: a
        truncated last line, and records left out because a field the analysis reads has a value
        it cannot use (:mod:`whyidle.record.schema`; one line per kind, with the first reason).
        A damaged line (not a JSON object: a write cut short by a kill, a disk error) is skipped and
        counted, wherever it is. A file still being written (``whyidle report`` of a live run) is
        read up to its size when it was opened, so a writer faster than the reader cannot keep it
        reading forever.
    Errors:
        RunDirError: most lines are damaged (not a whyidle record file), or the file cannot be read.
    """
    records: list[dict] = []
    problems: list[str] = []
    if not os.path.exists(path):
        return records, problems
    damaged: list[int] = []  # numbers of the lines that are not JSON objects
    lines = last = 0
    left_out: dict[str, list] = {}  # kind -> [count, first reason]

    def leave_out(kind, why: str, count: int = 1) -> None:
        entry = left_out.setdefault(str(kind)[:40], [0, why])
        entry[0] += count

    adders = {} if steps is None else {"step": steps.add, "steps": steps.add_lite, "gpu_step": steps.add_gpu}
    merger = compact.StacksMerger(stacks_group) if stacks_group > 1 else None
    # the step lines not yet taken and their line numbers: decoded together, before the next line
    # read the general way (stacks merged and host ticks skipped in between do not touch steps)
    batch: list[bytes] = []
    batch_numbers: list[int] = []
    mark_names: dict[str, str] = {}  # one copy of each gpu_marks phase and kind

    def take(number: int, raw: bytes) -> None:
        """Reads one line the general way: parsed, checked, then kept, counted or left out."""
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            damaged.append(number)
            return
        kind = obj.get("k")
        if not isinstance(kind, str):
            leave_out(kind, "no record kind (k)")
            return
        add = adders.get(kind)
        if add is not None:  # add/add_gpu: kept or not; add_lite: the rows left out
            result = add(obj)
            bad = int(not result) if isinstance(result, bool) else result
            if bad:
                leave_out(kind, "a field is not a number or the interval ends before it starts", bad)
            return
        why = schema.problem(obj)
        if why:
            leave_out(kind, why)
            return
        if merger is not None and kind == "stacks":
            merger.add(obj)
            return
        records.append(obj)

    def take_steps() -> None:
        """Takes the batched step lines: in one typed decode when all are well typed, else each
        on its own (the typed decode of one line, or the general way)."""
        if len(batch) < _STEP_BATCH_MIN or not stepdecode.add_lines(steps, batch):
            for number, raw in zip(batch_numbers, batch):
                if not stepdecode.add_line(steps, raw):
                    take(number, raw)
        batch.clear()
        batch_numbers.clear()

    ticks = tops = 0
    skipped_tick: tuple[int, bytes] | None = None  # (line number, line) of the last tick not read
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size  # a live run's writer appends: read what is there now
            read = 0
            for number, raw in enumerate(f, start=1):
                start, read = read, read + len(raw)
                if start >= size or (read > size and not raw.endswith(b"\n")):
                    break  # appended after the start, or still being written
                if not raw.strip():
                    continue
                lines += 1
                last = number
                if steps is not None:
                    if raw.startswith(stepdecode.STEP_PREFIX):
                        batch.append(raw)
                        batch_numbers.append(number)
                        if len(batch) >= _STEP_BATCH:
                            take_steps()
                        continue
                    if raw.startswith(stepdecode.STEPS_PREFIX):
                        if batch:
                            take_steps()
                        if stepdecode.add_line(steps, raw):
                            continue  # a well-typed ``steps`` line, appended without a dict
                if tick_stride > 1 and raw.startswith(_HOST_PREFIX):
                    ticks += 1
                    if (ticks - 1) % tick_stride:
                        skipped_tick = (number, raw)
                        continue
                    skipped_tick = None
                elif merger is not None and raw.startswith(compact.STACKS_PREFIX):
                    rec = compact.decode_stacks(raw)
                    if rec is not None:
                        merger.add(rec)
                        continue
                elif raw.startswith(marks.MARKS_PREFIX):
                    rec = marks.decode_marks(raw, mark_names)
                    if rec is not None:
                        records.append(rec)
                        continue
                elif tick_stride > 1 and raw.startswith(_TOP_PREFIX):
                    tops += 1
                    if (tops - 1) % tick_stride:
                        continue
                if batch:  # the steps before this line are in the table before it is read
                    take_steps()
                take(number, raw)
            if batch:
                take_steps()
        if skipped_tick is not None:  # the last tick is always read: it closes the run's deltas
            number, raw = skipped_tick
            obj = _parsed(raw)
            if obj is None or obj.get("k") != "host":
                bisect.insort(damaged, number)
            elif why := schema.problem(obj):
                leave_out("host", why)
            else:
                records.append(obj)
    except OSError as exc:
        raise RunDirError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if merger is not None:
        records.extend(merger.finish())
    name = os.path.basename(path)
    if damaged and 2 * len(damaged) > lines and lines > 1:
        raise RunDirError(f"{path}: line {damaged[0]} and {len(damaged) - 1} more of {lines} lines are not JSON "
                          "records; the file is corrupt")
    if damaged and damaged[-1] == last:
        problems.append(f"{name}: skipped a truncated last line")
        damaged.pop()
    if damaged:
        many = len(damaged) > 1
        problems.append(f"{name}: skipped {len(damaged)} damaged line{'s' if many else ''} (line{'s' if many else ''} "
                        f"{', '.join(map(str, damaged[:3]))}{', …' if len(damaged) > 3 else ''}: "
                        f"{'not JSON records' if many else 'not a JSON record'})")
    for kind, (count, why) in left_out.items():
        problems.append(f"{os.path.basename(path)}: left out {count} {kind!r} record{'s' if count > 1 else ''} "
                        f"with unusable values ({why[:120]})")
    return records, problems


def host_tick_stride(path: str, head_bytes: int = 1 << 20) -> int:
    """The ``tick_stride`` that keeps a ``host.jsonl`` near :data:`HOST_TICKS_MAX` ticks."""
    return _per_budget(path, _HOST_PREFIX, HOST_TICKS_MAX, head_bytes)


def stacks_group(path: str, head_bytes: int = 1 << 20) -> int:
    """The ``stacks_group`` that keeps a ``proc-<pid>.jsonl``'s stack records near
    :data:`whyidle.record.compact.STACKS_MAX`."""
    return _per_budget(path, compact.STACKS_PREFIX, compact.STACKS_MAX, head_bytes)


def _per_budget(path: str, prefix: bytes, budget: int, head_bytes: int) -> int:
    """How many of the file's lines starting with ``prefix`` make one, to keep near ``budget``
    of them: estimated from the file's size and its first ``head_bytes`` (the share of its bytes
    in such lines and their mean length); 1 for a file that small or unreadable."""
    try:
        size = os.path.getsize(path)
        if size <= head_bytes:
            return 1
        with open(path, "rb") as f:
            head = f.read(head_bytes).split(b"\n")[:-1]
    except OSError:
        return 1
    mine = [len(line) + 1 for line in head if line.startswith(prefix)]
    if not mine:
        return 1
    lines = size * sum(mine) / sum(len(line) + 1 for line in head) / (sum(mine) / len(mine))
    return max(1, math.ceil(lines / budget))


def _parsed(raw: bytes) -> dict | None:
    """One line as a JSON object, or None."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


class _MetaUnreadable(RunDirError):
    """``meta.json`` cannot be read or parsed (the records may still be usable)."""


def _read_meta(meta_path: str, problems: list[str]) -> dict:
    """``meta.json`` as a dict; a field whose value the report cannot use is dropped with a note.

    Errors: :class:`RunDirError` when it is not of format ``whyidle.run/1``; ``_MetaUnreadable``
    when it cannot be read or is not a JSON object."""
    try:
        with open(meta_path, encoding="utf-8", errors="replace") as f:
            meta = json.load(f)
        if not isinstance(meta, dict):
            raise ValueError
    except (ValueError, RecursionError):
        raise _MetaUnreadable(f"{meta_path}: not valid JSON; the run directory is corrupt") from None
    except OSError as exc:
        raise _MetaUnreadable(f"{meta_path}: cannot read ({exc.strerror or exc})") from None
    if meta.get("format") != "whyidle.run/1":
        raise RunDirError(f"{meta_path}: unknown format {str(meta.get('format'))[:60]!r} (expected whyidle.run/1)")
    for key, spec in schema.META.items():
        name = key.rstrip("?")
        if name in meta and schema.check(meta[name], spec, name):
            problems.append(f"meta.json: ignored {schema.check(meta[name], spec, name)[:120]}")
            del meta[name]
    return meta


def load_run(path: str, read_proc=None, samples: bool = True) -> RunData:
    """Loads a run directory written by ``whyidle run``.

    ``read_proc``: which ``proc-<pid>.jsonl`` files to read (a test of the pid; default all);
    ``samples``: False leaves ``host.jsonl``, ``gpu.jsonl``, ``windows.jsonl`` and
    ``traces.jsonl`` unread (a merge of node runs reads the rank summaries of the ranks it does not
    describe, and the machine samples of its node only: :mod:`whyidle.record.merge`).
    A file of mostly damaged lines (:func:`read_jsonl`) is left out with a note when the others
    hold records. Errors:
        RunDirError: not a directory, no whyidle records in it (every record file damaged or
        absent), or a ``meta.json`` of another format.
    """
    if os.path.isfile(path):
        raise RunDirError(f"{path}: a file, not a run directory (a profiler trace: whyidle trace {path})")
    if not os.path.isdir(path):
        raise RunDirError(f"{path}: no such run directory")
    meta: dict = {}
    problems: list[str] = []
    meta_path = os.path.join(path, "meta.json")
    meta_error = None
    if os.path.exists(meta_path):
        try:
            meta = _read_meta(meta_path, problems)
        except _MetaUnreadable as exc:
            meta_error = exc
    corrupt: list[RunDirError] = []

    def read(file: str, table: StepTable | None = None, stride: int = 1, group: int = 1) -> list[dict]:
        try:
            records, p = read_jsonl(file, steps=table, tick_stride=stride, stacks_group=group)
        except RunDirError as exc:  # this file is left out; the others may hold the run
            corrupt.append(exc)
            problems.append(f"{os.path.basename(file)}: left out: {str(exc).split(': ', 1)[-1]}")
            return []
        problems.extend(p)
        return records

    host_path = os.path.join(path, "host.jsonl")
    stride = host_tick_stride(host_path) if samples else 1
    host = read(host_path, stride=stride) if samples else []
    if stride > 1:
        n = sum(1 for r in host if r.get("k") == "host")
        problems.append(f"host.jsonl: a long run: one host tick and process scan in {stride} read ({n:,} ticks); "
                        "CPU, disk and context-switch figures are exact between them, memory and other processes "
                        "are sampled at them")
    gpu = read(os.path.join(path, "gpu.jsonl")) if samples else []
    procs: dict[int, list[dict]] = {}
    steps: dict[int, StepTable] = {}
    passed = False  # a proc file left unread (read_proc)
    for file in sorted(glob.glob(os.path.join(path, "proc-*.jsonl"))):
        m = re.search(r"proc-(\d+)\.jsonl$", file)
        if not m:
            continue
        if read_proc is not None and not read_proc(int(m.group(1))):
            passed = True
            continue
        table = StepTable()
        group = stacks_group(file)
        procs[int(m.group(1))] = read(file, table, group=group)
        if group > 1:
            problems.append(f"{os.path.basename(file)}: a long run: its stack samples summed by {group} flushes "
                            f"({group * 0.5:g} s) outside its first and last 10 minutes")
        steps[int(m.group(1))] = table
        table.mark_profiled(traced_spans(procs[int(m.group(1))]))
    recorded = host or passed or any(procs.values()) or any(len(t) for t in steps.values())
    if not recorded and (corrupt or not (meta or procs)):
        raise (corrupt[0] if corrupt else None) or meta_error or RunDirError(
            f"{path}: not a whyidle run directory (no meta.json or records)")
    if meta_error:
        problems.append(f"meta.json: {str(meta_error).split(': ', 1)[-1].split(';')[0]}: ignored (the command, its "
                        "exit code and the run's start and end are unknown)")
    elif not meta:
        problems.append("meta.json: missing (the command, its exit code and the run's start and end are unknown)")
    windows = sorted((r for r in read(os.path.join(path, "windows.jsonl")) if r.get("k") == "window"),
                     key=lambda r: r["t0"]) if samples else []
    deep_traces = [r for r in read(os.path.join(path, "traces.jsonl")) if r.get("k") == "deep_trace"] if samples else []
    workers, worker_problems = read_loader_files(path)
    problems.extend(worker_problems)
    redact_run(meta, host, procs)
    cells.name_cells(meta, procs)  # a notebook kernel's cell files named "cell N" (record/cells.py)
    return RunData(path=path, meta=meta, host=host, gpu=gpu, procs=procs, problems=problems, steps=steps,
                   windows=windows, deep_traces=deep_traces, loader_workers=workers)


def traced_spans(records: list[dict]) -> list[tuple[int, int]]:
    """The ``(t0, t1)`` of a process's deep-trace windows (``trace_window`` records)."""
    return [(r["t0"], r["t1"]) for r in records if r.get("k") == "trace_window"
            and isinstance(r.get("t0"), int) and isinstance(r.get("t1"), int)]


def redact_run(meta: dict, host: list[dict], procs: dict[int, list[dict]]) -> None:
    """Redacts, in place, the command lines a run directory holds (:mod:`whyidle.redact`):
    ``meta.json`` ``command``, ``host_proc`` ``cmdline`` and ``proc`` ``argv``; ``host_top``
    commands (processes outside the job) are cut to their program and script
    (:func:`whyidle.cmdline.program_and_script`). ``whyidle run`` stores them so already; runs
    recorded before it did are redacted here, so no report, timeline or comparison built from them
    shows a secret."""
    if isinstance(meta.get("command"), list):
        meta["command"] = redact_argv(meta["command"])
    for rec in host:
        k = rec.get("k")
        if k == "host_proc" and isinstance(rec.get("cmdline"), list):
            rec["cmdline"] = redact_argv(rec["cmdline"])
        elif k == "host_top":
            for key in ("procs", "yielding_procs"):
                for row in rec.get(key) or []:
                    if isinstance(row, list) and len(row) > 1 and isinstance(row[1], str) and len(row[1].split()) > 1:
                        row[1] = program_and_script(row[1].split())
    for records in procs.values():
        for rec in records:
            if rec.get("k") == "proc" and isinstance(rec.get("argv"), list):
                rec["argv"] = redact_argv(rec["argv"])
