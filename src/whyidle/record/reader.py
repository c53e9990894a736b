"""Readers of a run directory (format in ``docs/run-format.md``).

Readers accept a truncated last line (a write cut short by a kill) and report any other damage as
:class:`RunDirError` with a one-line message naming the file and line.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

from whyidle.record.steptable import StepTable


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
    """

    path: str
    meta: dict
    host: list
    gpu: list
    procs: dict
    problems: list
    steps: dict = dataclasses.field(default_factory=dict)


def read_jsonl(path: str, steps: "StepTable | None" = None) -> tuple[list[dict], list[str]]:
    """Reads a JSON Lines file, streaming.

    Args:
        path: the file (a missing file reads as empty).
        steps: when given, ``step`` and ``gpu_step`` records go into this table instead of the
            returned list (keeps memory small for long runs).
    Returns:
        (records, problems): the parsed objects in file order; problems lists skipped damage.
    Errors:
        RunDirError: a line other than the last one is not a JSON object.
    """
    records: list[dict] = []
    problems: list[str] = []
    if not os.path.exists(path):
        return records, problems
    bad_line = None
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if bad_line is not None:  # damage followed by more data: not a cut-off write
                raise RunDirError(f"{path}: line {bad_line} is not a JSON record; the run directory is corrupt")
            try:
                obj = json.loads(raw)
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
            except ValueError:
                bad_line = number
                continue
            if steps is not None and obj.get("k") in ("step", "steps", "gpu_step"):
                {"step": steps.add, "steps": steps.add_lite, "gpu_step": steps.add_gpu}[obj["k"]](obj)
            else:
                records.append(obj)
    if bad_line is not None:
        problems.append(f"{os.path.basename(path)}: skipped a truncated last line")
    return records, problems


def load_run(path: str) -> RunData:
    """Loads a run directory written by ``whyidle run``.

    Errors:
        RunDirError: not a directory, no whyidle records in it, or corrupt files.
    """
    if os.path.isfile(path):
        raise RunDirError(f"{path}: a file, not a run directory (a profiler trace: whyidle trace {path})")
    if not os.path.isdir(path):
        raise RunDirError(f"{path}: no such run directory")
    meta: dict = {}
    problems: list[str] = []
    meta_path = os.path.join(path, "meta.json")
    if os.path.exists(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            if not isinstance(meta, dict):
                raise ValueError
        except ValueError:
            raise RunDirError(f"{meta_path}: not valid JSON; the run directory is corrupt") from None
        if meta.get("format") != "whyidle.run/1":
            raise RunDirError(f"{meta_path}: unknown format {meta.get('format')!r} (expected whyidle.run/1)")
    host, p = read_jsonl(os.path.join(path, "host.jsonl"))
    problems += p
    gpu, p = read_jsonl(os.path.join(path, "gpu.jsonl"))
    problems += p
    procs: dict[int, list[dict]] = {}
    steps: dict[int, StepTable] = {}
    for file in sorted(glob.glob(os.path.join(path, "proc-*.jsonl"))):
        m = re.search(r"proc-(\d+)\.jsonl$", file)
        if not m:
            continue
        table = StepTable()
        records, p = read_jsonl(file, steps=table)
        problems += p
        procs[int(m.group(1))] = records
        steps[int(m.group(1))] = table
    if not meta and not host and not procs:
        raise RunDirError(f"{path}: not a whyidle run directory (no meta.json or records)")
    return RunData(path=path, meta=meta, host=host, gpu=gpu, procs=procs, problems=problems, steps=steps)
