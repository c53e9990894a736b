"""A mutation fuzzer for whyidle's readers: damaged run directories and profiler traces.

Used by ``tests/test_fuzz.py`` (a fixed seed, bounded, in CI) and ``benchmarks/fuzz.py`` (longer).
Each case copies a real input (a recorded run directory of ``tests/data/runs``, a trace of
``../shared/traces`` or a synthetic one), damages it the way real files get damaged or the way a
hostile file is built, runs the command a user would (``whyidle report``, ``whyidle trace``,
``whyidle compare``, in this process through click's runner) and checks the contract for bad input:

- exit code 0 (the damage was skipped: the report is written, as strict JSON, no NaN) or 2 (one
  line on stderr, ``whyidle: <path>: …``, naming the input), never a traceback, nor the one line
  the trace reader prints for an exception it did not expect (``cannot analyze (TypeError: …)``);
- nothing else printed on stderr than that line when it fails.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gzip
import json
import os
import random
import shutil

from click.testing import CliRunner

#: Values put in place of a field: wrong types, huge and non-finite numbers, negative durations.
ODD_VALUES = [None, True, False, -1, 0, 1, -123456789, 2 ** 70, -(2 ** 70), 1e308, -1e308, 1e-300,
              float("nan"), float("inf"), float("-inf"), "", "12", "abc", "x" * 5000, [], [1, 2], {}, {"a": None},
              [[[[[]]]]], -0.5, 3.5]


@dataclasses.dataclass
class Outcome:
    """One fuzz case: what was done and what whyidle did. ``problem`` is None when the contract held."""

    what: str
    exit_code: int
    problem: str | None


def _paths(obj, prefix=()):
    """Every (path, value) inside a JSON value, depth first."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:50]):
            yield from _paths(v, (*prefix, i))


def mutate_value(obj, rng: random.Random):
    """``obj`` (a parsed JSON value) with one node replaced by an odd value, deleted, or (for a
    list) reordered; returns (new object, description)."""
    nodes = [p for p, _ in _paths(obj) if p]
    if not nodes:
        return copy.deepcopy(rng.choice(ODD_VALUES)), "whole value replaced"
    path = rng.choice(nodes)
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    roll = rng.random()
    if roll < 0.15 and isinstance(parent, dict):
        del parent[key]
        return obj, f"deleted {'.'.join(map(str, path))}"
    if roll < 0.22 and isinstance(parent[key], list) and len(parent[key]) > 1:
        rng.shuffle(parent[key])
        return obj, f"shuffled {'.'.join(map(str, path))}"
    value = copy.deepcopy(rng.choice(ODD_VALUES))
    parent[key] = value
    return obj, f"{'.'.join(map(str, path))} = {str(value)[:20]}"


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """``data`` damaged at the byte level: truncated, bits flipped, junk, invalid UTF-8, NUL bytes,
    lines duplicated, dropped or swapped, a giant string, deep nesting, duplicate keys."""
    n = len(data)
    kind = rng.choice(["truncate", "flip", "junk", "utf8", "dup", "drop", "swap", "giant", "deep", "empty", "nul",
                       "dupkey"])
    at = rng.randrange(n + 1) if n else 0
    if kind == "truncate":
        return data[:at], f"truncated at {at}"
    if kind == "flip" and n:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), "bits flipped"
    if kind == "junk":
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[at:], "junk inserted"
    if kind == "utf8":
        return data[:at] + b"\xff\xfe\xc3(" + data[at:], "invalid UTF-8"
    if kind == "nul":
        return data[:at] + b"\x00" * rng.randint(1, 100) + data[at:], "NUL bytes"
    if kind == "dupkey":  # the same key twice in objects: JSON readers keep one of them
        key = rng.choice([b'"t":', b'"ts":', b'"k":', b'"dur":', b'"name":'])
        return data.replace(key, key + b' "dup", ' + key, rng.randint(1, 50)), f"duplicate {key.decode()} keys"
    lines = data.split(b"\n")
    if kind == "dup" and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return b"\n".join(lines), "line duplicated"
    if kind == "drop" and len(lines) > 1:
        del lines[rng.randrange(len(lines))]
        return b"\n".join(lines), "line dropped"
    if kind == "swap" and len(lines) > 2:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines), "lines swapped"
    if kind == "giant":
        return data[:at] + b'"' + b"A" * rng.choice([10 ** 5, 10 ** 6]) + b'"' + data[at:], "giant string"
    if kind == "deep":
        depth = rng.choice([1000, 100_000])
        return data[:at] + b"[" * depth + b"]" * rng.choice([0, depth]) + data[at:], f"nesting {depth} deep"
    if kind == "empty":
        return b"", "emptied"
    return data + b"\n{}\n", "empty object appended"


def _dump(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def mutate_jsonl(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A JSON Lines file with one record's field made odd (most cases) or damaged bytes."""
    lines = data.split(b"\n")
    idx = [i for i, line in enumerate(lines) if line.strip()]
    if idx and rng.random() < 0.7:
        done = []
        for _ in range(rng.choice([1, 1, 1, 3, 20])):
            i = rng.choice(idx)
            try:
                obj = json.loads(lines[i])
            except ValueError:
                continue
            obj, what = mutate_value(obj, rng)
            lines[i] = _dump(obj)
            done.append(f"line {i + 1}: {what}")
        return b"\n".join(lines), "; ".join(done[:3])
    return mutate_bytes(data, rng)


def mutate_trace(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A Kineto trace (JSON text) with odd fields in some events or top-level keys, or damaged bytes."""
    if rng.random() < 0.75:
        try:
            doc = json.loads(data)
        except ValueError:
            return mutate_bytes(data, rng)
        events = doc.get("traceEvents") if isinstance(doc, dict) else None
        done = []
        for _ in range(rng.choice([1, 1, 5, 50])):
            if isinstance(events, list) and events and rng.random() < 0.9:
                i = rng.randrange(len(events))
                events[i], what = mutate_value(events[i], rng)
                done.append(f"event {i}: {what}")
            else:
                doc, what = mutate_value(doc, rng)
                events = doc.get("traceEvents") if isinstance(doc, dict) else None
                done.append(what)
        if isinstance(events, list) and rng.random() < 0.1:
            rng.shuffle(events)
            done.append("events shuffled")
        return _dump(doc), "; ".join(done[:3])
    return mutate_bytes(data, rng)


def _check(result, target: str, out_json: str | None) -> str | None:
    """The contract's breach in one CLI result, or None."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(result.exception))
        return f"traceback ({type(result.exception).__name__}: {result.exception})\n{tb[-1500:]}"
    err = result.stderr.strip()
    if result.exit_code == 2:
        lines = err.splitlines()
        if len(lines) != 1 or not lines[0].startswith("whyidle: "):
            return f"exit 2 without one 'whyidle: ' line: {err[:300]!r}"
        if "cannot analyze (" in lines[0]:  # the readers' last resort: an exception they did not expect
            return f"unexpected exception told in one line: {lines[0][:300]}"
        return None
    if result.exit_code != 0:
        return f"exit code {result.exit_code}: {err[:300]!r}"
    if "Traceback" in err:
        return f"traceback on stderr: {err[-500:]}"
    if out_json:
        try:
            with open(out_json, encoding="utf-8") as f:
                json.load(f, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except (OSError, ValueError) as exc:
            return f"report JSON not strict JSON: {exc!r}"[:300]
    return None


def run_cli(args: list[str]):
    """Runs ``whyidle ARGS`` in this process as click would; stdout and stderr kept apart."""
    from whyidle.cli import main

    return CliRunner().invoke(main, args, catch_exceptions=True)


def fuzz_run_dir(seed_dir: str, work: str, rng: random.Random) -> Outcome:
    """One damaged copy of ``seed_dir`` under ``work``, reported with ``whyidle report``."""
    target = os.path.join(work, "run")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(seed_dir, target)
    for name in ("report.json", "report.html", "timeline.json"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(target, name))
    files = sorted(f for f in os.listdir(target) if f.endswith((".jsonl", ".json")))
    what = []
    for name in rng.sample(files, k=min(len(files), rng.choice([1, 1, 1, 2]))):
        path = os.path.join(target, name)
        with open(path, "rb") as f:
            data = f.read()
        if name == "meta.json":
            if rng.random() < 0.8:
                obj, w = mutate_value(json.loads(data), rng)
                data = _dump(obj)
            else:
                data, w = mutate_bytes(data, rng)
        else:
            data, w = mutate_jsonl(data, rng)
        with open(path, "wb") as f:
            f.write(data)
        what.append(f"{name}: {w}")
    out = os.path.join(work, "out.json")
    with contextlib.suppress(OSError):
        os.unlink(out)
    result = run_cli(["report", target, "--json", out])
    desc = f"{os.path.basename(seed_dir)} | " + " | ".join(what)
    return Outcome(desc, result.exit_code, _check(result, target, out if result.exit_code == 0 else None))


def fuzz_compare(seed_dirs: list[str], work: str, rng: random.Random) -> Outcome:
    """Two damaged runs compared with ``whyidle compare``."""
    runs = []
    what = []
    for k, seed in enumerate(rng.sample(seed_dirs, 2)):
        sub = os.path.join(work, f"c{k}")
        os.makedirs(sub, exist_ok=True)
        o = fuzz_run_dir(seed, sub, rng) if rng.random() < 0.7 else None
        if o is None:
            shutil.rmtree(os.path.join(sub, "run"), ignore_errors=True)
            shutil.copytree(seed, os.path.join(sub, "run"))
        runs.append(os.path.join(sub, "run"))
        what.append(o.what if o else os.path.basename(seed))
    out = os.path.join(work, "cmp.json")
    with contextlib.suppress(OSError):
        os.unlink(out)
    result = run_cli(["compare", *runs, "--json", out])
    return Outcome("compare: " + " || ".join(what), result.exit_code,
                   _check(result, runs[0], out if result.exit_code == 0 else None))


def fuzz_trace(seed_text: bytes, name: str, work: str, rng: random.Random) -> Outcome:
    """One damaged copy of a trace's JSON text (sometimes gzipped) read with ``whyidle trace``."""
    data, what = mutate_trace(seed_text, rng)
    gz = rng.random() < 0.2
    path = os.path.join(work, "t.json.gz" if gz else "t.json")
    for old in ("t.json", "t.json.gz"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(work, old))
    if gz:
        data = gzip.compress(data, compresslevel=1)
        if rng.random() < 0.3:
            data, w = mutate_bytes(data, rng)
            what += f"; gzip {w}"
    with open(path, "wb") as f:
        f.write(data)
    out = os.path.join(work, "trace.json")
    with contextlib.suppress(OSError):
        os.unlink(out)
    result = run_cli(["trace", path, "--json", out])
    return Outcome(f"{name}{' (gz)' if gz else ''} | {what}", result.exit_code,
                   _check(result, path, out if result.exit_code == 0 else None))


def seed_traces(limit_bytes: int = 8 << 20) -> list[tuple[str, bytes]]:
    """(name, JSON text) of the traces to mutate: a synthetic one (always) and the shared real
    traces under ``limit_bytes`` when ``../shared/traces`` exists."""
    from test_trace_cli import synthetic_trace  # tests/ is on sys.path

    seeds = [("synthetic", json.dumps(synthetic_trace()).encode())]
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "traces")
    if os.path.isdir(root):
        for dirpath, _dirs, files in sorted(os.walk(root)):
            for f in sorted(files):
                if not f.endswith((".json", ".json.gz")):
                    continue
                p = os.path.join(dirpath, f)
                opener = gzip.open if f.endswith(".gz") else open
                with opener(p, "rb") as fh:
                    data = fh.read(limit_bytes + 1)
                if len(data) <= limit_bytes:
                    seeds.append((os.path.relpath(p, root), data))
    return seeds
