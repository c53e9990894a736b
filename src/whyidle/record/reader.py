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
        procs: pid → records of ``proc-<pid>.jsonl``.
        problems: readable notes about skipped damage (e.g. a truncated last line).
    """

    path: str
    meta: dict
    host: list
    gpu: list
    procs: dict
    problems: list


def read_jsonl(path: str) -> tuple[list[dict], list[str]]:
    """Reads a JSON Lines file.

    Returns:
        (records, problems): the parsed objects in file order; problems lists skipped damage.
    Errors:
        RunDirError: a line other than the last one is not a JSON object.
    """
    records: list[dict] = []
    problems: list[str] = []
    if not os.path.exists(path):
        return records, problems
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    # A file that ends with "\n" yields a last empty element.
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    for number, raw in enumerate(lines[: last + 1], start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == last + 1:
                problems.append(f"{os.path.basename(path)}: skipped a truncated last line")
                break
            raise RunDirError(
                f"{path}: line {number} is not a JSON record; the run directory is corrupt"
            ) from None
        records.append(obj)
    return records, problems


def load_run(path: str) -> RunData:
    """Loads a run directory written by ``whyidle run``.

    Errors:
        RunDirError: not a directory, no whyidle records in it, or corrupt files.
    """
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
    for file in sorted(glob.glob(os.path.join(path, "proc-*.jsonl"))):
        m = re.search(r"proc-(\d+)\.jsonl$", file)
        if not m:
            continue
        records, p = read_jsonl(file)
        problems += p
        procs[int(m.group(1))] = records
    if not meta and not host and not procs:
        raise RunDirError(f"{path}: not a whyidle run directory (no meta.json or records)")
    return RunData(path=path, meta=meta, host=host, gpu=gpu, procs=procs, problems=problems)
