"""Append-only JSON Lines writer with a bounded in-memory buffer.

Used inside the observed process (so: standard library only) and by the sampler. Records are
queued with :meth:`JsonlWriter.add` from any thread (``collections.deque`` appends are atomic under
the GIL, so the training thread never takes a lock) and written by :meth:`flush`, which the owner
calls periodically from a background thread (at least every 0.5 s, see ``docs/run-format.md``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os

from whyidle.jsonsafe import json_text

#: Records held in memory at most before new ones are dropped (and counted): bounds memory if the
#: disk stalls. 100,000 small records are ~20 MB of Python objects at worst.
MAX_BUFFERED_RECORDS = 100_000
#: Mode of the files whyidle creates (before the umask): readable by their owner only, since they
#: describe the user's program, paths and machine (docs/run-format.md, "Permissions").
FILE_MODE = 0o600


class JsonlWriter:
    """Appends JSON objects, one per line, to ``path``; the file is created on first flush, with
    mode :data:`FILE_MODE` (less what the umask takes away).

    Args:
        path: file to append to.
        max_buffered: records kept in memory between flushes before dropping new ones.

    Errors: :meth:`flush` raises ``OSError`` when the file cannot be written; callers in the
    observed process catch it and disable themselves.
    """

    def __init__(self, path: str, max_buffered: int = MAX_BUFFERED_RECORDS) -> None:
        self.path = path
        self.max_buffered = max_buffered
        self.dropped = 0
        self._queue: collections.deque = collections.deque()
        self._file = None

    def add(self, record: dict) -> None:
        """Queues one record (a JSON-serializable dict). Never blocks, never raises."""
        if len(self._queue) >= self.max_buffered:
            self.dropped += 1
            return
        self._queue.append(record)

    def flush(self) -> int:
        """Writes all queued records and flushes the OS buffer. Returns the number written."""
        if not self._queue:
            return 0
        lines = []
        queue = self._queue
        while True:
            try:
                record = queue.popleft()
            except IndexError:
                break
            try:
                lines.append(json.dumps(record, separators=(",", ":"), default=str))
            except (TypeError, ValueError):  # e.g. a non-string dict key: skip it, keep the rest
                self.dropped += 1
        if not lines:
            return 0
        if self._file is None:
            self._file = os.fdopen(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE), "a",
                                   encoding="utf-8")
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()
        return len(lines)

    def close(self) -> None:
        """Flushes and closes; safe to call twice."""
        try:
            self.flush()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None

    def abandon(self) -> None:
        """Forgets queued records and the open file without writing (used after ``fork``)."""
        self._queue = collections.deque()
        self._file = None


@contextlib.contextmanager
def atomic_file(path: str, mode: str = "wb"):
    """Opens a temporary file beside ``path`` for writing (``mode`` ``"wb"`` or ``"w"``, UTF-8);
    when the block ends without an error it replaces ``path`` (``os.replace``), otherwise it is
    removed and ``path`` is left as it was. The temporary file is created anew with mode
    :data:`FILE_MODE` (less the umask), so ``path`` ends up with it too, even where it existed
    with a wider mode (a ``--json FILE`` the user names included).

    Errors: ``OSError`` when the directory is not writable.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):  # a leftover of a killed run with this pid
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str, obj: dict) -> None:
    """Writes ``obj`` as strict JSON (:func:`json_text`) to ``path`` atomically (:func:`atomic_file`).

    Errors: ``OSError`` when the directory is not writable.
    """
    text = json_text(obj)
    with atomic_file(path, "w") as f:
        f.write(text)
        f.write("\n")
