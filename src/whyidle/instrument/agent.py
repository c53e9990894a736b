"""The in-process agent: runs inside every Python process of an observed command.

The bootstrap (``whyidle/run/bootstrap/sitecustomize.py``) calls :func:`start_from_env` at
interpreter start-up when ``WHYIDLE_RUN_DIR`` is set. The agent does nothing visible until the
user's program imports a framework: an import hook then installs that framework's
instrumentation (``whyidle.instrument.torch``, ``whyidle.instrument.keras`` for ``keras`` and
``tensorflow``, ``whyidle.instrument.frameworks`` for Lightning, the HF ``Trainer`` and
Accelerate), opens ``RUN_DIR/proc-<pid>.jsonl`` and starts a
flusher thread. Standard library only: it runs beside the user's own packages.

The doctor must never harm the patient: every hook catches its own errors, disables the part that
failed and says so once (a ``notice`` record and one line on stderr).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.util
import os
import sys
import threading
import time

from whyidle.instrument.thread_cpu import ThreadCPU
from whyidle.record.writer import JsonlWriter

#: Seconds between flushes of the trainer's records: a ``kill -9`` loses at most this much
#: (docs/run-format.md promises "at most the last second").
FLUSH_PERIOD_S = 0.5

#: Environment variable naming the process that reads the run (the ``whyidle run`` process), set by
#: :func:`whyidle.run.launcher.child_env`: ``"<pid>:<start>"``, its pid and its start time in clock
#: ticks since boot (``/proc/<pid>/stat`` field 22), so a recycled pid is not taken for it.
READER_ENV = "WHYIDLE_READER"

#: Seconds between two looks, from the flusher thread, at the reader (one read of
#: ``/proc/<pid>/stat``) and at ``proc-<pid>.jsonl`` (one ``stat``): once the reader is gone, or the
#: file was removed, recording stops instead of filling the disk for the rest of a long job.
READER_CHECK_S = 2.0

#: Default stack-sampling rate of the training thread, Hz. The issue caps it at "a few hundred";
#: 100 Hz keeps the GIL hand-offs it forces to well under 1 % of a 10 ms step (benchmarks/overhead.py).
DEFAULT_STACK_HZ = 100.0

_AGENT: "Agent | None" = None


class Agent:
    """Per-process recorder: queues records, flushes them, reports its own failures once.

    Args:
        run_dir: the run directory (``WHYIDLE_RUN_DIR``).
        stack_hz: stack-sampling rate of the training thread in Hz; 0 disables sampling.
        reader: the :data:`READER_ENV` token of the process reading the run; recording stops once
            it is gone (:meth:`halt`). None: recording goes on until exit.
    """

    def __init__(self, run_dir: str, stack_hz: float = DEFAULT_STACK_HZ, reader: str | None = None) -> None:
        self.run_dir = run_dir
        self.t_start = time.monotonic_ns()  # interpreter start-up (the bootstrap runs first)
        self.stack_hz = stack_hz
        self.pid = os.getpid()
        self.writer = JsonlWriter(os.path.join(run_dir, f"proc-{self.pid}.jsonl"))
        self.disabled = False
        self.collectors: list = []  # callables returning records to write at each flush
        self.on_exit: list = []  # callables run once at exit, before the final flush
        self._notices: set[str] = set()
        self.overrides = False  # a tune trial's settings (whyidle.instrument.overrides.from_agent); False: not looked up
        self.startup = None  # the start-up sampler (whyidle.instrument.startup), once a framework is imported
        self._flusher: threading.Thread | None = None
        self._threads: ThreadCPU | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.reader = reader  # the reader's READER_ENV token, or None: nothing to watch
        self._written = False  # proc-<pid>.jsonl exists (a flush wrote to it)
        atexit.register(self.at_exit)

    def record(self, rec: dict) -> None:
        """Queues one record for ``proc-<pid>.jsonl``; cheap enough for the training step."""
        if not self.disabled:
            self.writer.add(rec)

    def notice(self, msg: str) -> None:
        """Says ``msg`` once: as a ``notice`` record and one ``[whyidle]`` line on stderr."""
        if msg in self._notices:
            return
        self._notices.add(msg)
        self.record({"k": "notice", "t": time.monotonic_ns(), "msg": msg})
        self.start_background()  # a notice is kept even when nothing else gets instrumented
        _say(msg)

    def start_background(self) -> None:
        """Starts the flusher thread (idempotent)."""
        with self._lock:
            if self._flusher is not None or self.disabled:
                return
            self._threads = ThreadCPU()  # the program's background threads' CPU (thread_cpu.py)
            self.collectors.append(self._threads.poll)
            self._flusher = threading.Thread(target=self._flush_loop, name="whyidle-flush", daemon=True)
            self._flusher.start()

    def _flush_loop(self) -> None:
        check = time.monotonic() + READER_CHECK_S
        while not self.disabled and not self._stop.wait(FLUSH_PERIOD_S):
            if time.monotonic() >= check:
                check = time.monotonic() + READER_CHECK_S
                why = self._orphaned()
                if why:
                    self.halt(why)
                    return
            self.flush()

    def _orphaned(self) -> str | None:
        """Why recording must stop (the reader is gone, or ``proc-<pid>.jsonl`` was removed), else None."""
        if self.reader and not reader_alive(self.reader):
            return (f"whyidle (pid {self.reader.split(':', 1)[0]}) is gone: recording stopped, "
                    "the program goes on")
        if self._written and not os.path.exists(self.writer.path):
            return f"{self.writer.path} was removed: recording stopped, the program goes on"
        return None

    def halt(self, msg: str) -> None:
        """Stops recording for good: writes the queued records and a last ``notice`` saying ``msg``,
        closes ``proc-<pid>.jsonl``, says ``msg`` once on stderr; the hooks then do nothing (they
        test :attr:`disabled`). Called from the flusher thread; never raises."""
        if self.disabled:
            return
        self.disabled = True  # from here on the hooks record nothing: the notice is the last line
        with contextlib.suppress(Exception):  # a collector that fails costs its records, not the rest
            for collect in list(self.collectors):
                for rec in collect():
                    self.writer.add(rec)
        self.writer.add({"k": "notice", "t": time.monotonic_ns(), "msg": msg})
        with contextlib.suppress(Exception):  # said on stderr all the same
            self.writer.close()
        _say(msg)

    def flush(self) -> None:
        """Collects pending aggregates and writes queued records; on an I/O error (a full, removed
        or read-only run directory) stops recording for good, closes the file and says so once."""
        if self.disabled:
            return
        try:
            for collect in list(self.collectors):
                for rec in collect():
                    self.writer.add(rec)
            if self.writer.flush():
                self._written = True
        except Exception as exc:  # never let recording break the program
            self.disabled = True
            with contextlib.suppress(Exception):  # closed now: the fd is freed, the unwritable buffer dropped
                self.writer.close()
            if isinstance(exc, OSError):
                _say(f"cannot write {self.writer.path} ({exc.strerror or exc}): recording stopped, "
                     "the program goes on")
            else:
                _say(f"recording stopped: {exc!r}")

    def at_exit(self) -> None:
        """Stops the agent's threads and writes the last records at interpreter exit.

        Runs from ``atexit`` (normal exit, ``sys.exit``, an uncaught exception). The threads are
        joined here, before interpreter finalization: a daemon thread woken during finalization is
        ended with ``pthread_exit``, whose forced unwind can abort a process that holds C++ frames
        ("terminate called without an active exception").
        """
        if os.getpid() != self.pid:
            return
        self._stop.set()
        for stop in list(self.on_exit):
            try:
                stop()
            except Exception:
                pass
        if self._flusher is not None:
            self._flusher.join(timeout=2 * FLUSH_PERIOD_S)
        if self.disabled or self._flusher is None:
            return  # nothing was instrumented in this process: leave no file behind
        now = time.monotonic_ns()
        try:
            self._threads.poll()
            threads = self._threads.record(now)
            if threads:
                self.record(threads)
        except Exception:
            pass
        self.record({"k": "exit", "t": now})
        self.flush()
        try:
            self.writer.close()
        except Exception:
            pass

    def stop(self) -> None:
        """Ends the observation of a process that goes on (``whyidle.watch()``, the ``%%whyidle``
        magic): what :meth:`at_exit` does (threads stopped, last records written, the file
        closed), then every hook, wrapper, timer and signal handler of whyidle's is taken out
        (:func:`whyidle.instrument.patches.restore`), the import hook leaves ``sys.meta_path``
        and the process has no agent any more: a later :func:`start` observes it afresh.
        Idempotent; never raises."""
        global _AGENT
        from whyidle.instrument import patches

        try:  # a KeyboardInterrupt here (a second Ctrl-C) still takes every hook out
            with contextlib.suppress(Exception):
                self.at_exit()
        finally:
            with contextlib.suppress(Exception):
                atexit.unregister(self.at_exit)
            self.disabled = True  # a wrapper someone else kept calling ours passes calls through
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportHook)]
            patches.restore()
            if _AGENT is self:
                _AGENT = None

    def _after_fork(self) -> None:
        # Forked trainers are therefore not observed; spawn-started ones get their own agent
        # from the bootstrap.
        self.disabled = True
        self.collectors = []
        self.writer.abandon()


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched module finishes importing (and the callback's
    ``before`` attribute, when it has one, right before the module's code runs).

    A hook is used up only when the module is executed: ``importlib.util.find_spec`` alone
    (TensorFlow asks it about ``keras`` without importing it) also reaches this finder.
    """

    def __init__(self, hooks: dict) -> None:
        self.hooks = hooks
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        hook = self.hooks.get(fullname)
        if hook is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, lambda module: self._fire(fullname, module),
                                    getattr(hook, "before", None))
        return spec

    def _fire(self, fullname: str, module) -> None:
        hook = self.hooks.pop(fullname, None)
        if hook is not None:
            hook(module)


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader, hook, before=None) -> None:
        self._loader = loader
        self._hook = hook
        self._before = before

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        if self._before is not None:
            try:
                self._before()
            except Exception:  # never in the program's way
                pass
        self._loader.exec_module(module)
        # Give the module back its real loader (importlib.resources and others inspect it).
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._hook(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _installer(instrument: str, function: str, label: str):
    """A post-import hook that calls ``whyidle.instrument.<instrument>.<function>(agent, module)``
    and turns any failure into one notice."""

    def install(module) -> None:
        agent = _AGENT
        if agent is None or agent.disabled:
            return
        try:
            mod = importlib.import_module(f"whyidle.instrument.{instrument}")
            getattr(mod, function)(agent, module)
        except Exception as exc:
            agent.notice(f"{label} instrumentation disabled: {exc!r}")

    return install


def _then(*installs):
    """One post-import hook running several installers in order (each turns its failure into a notice)."""

    def install(module) -> None:
        for one in installs:
            one(module)

    return install


#: A ``whyidle tune`` trial's settings (:mod:`whyidle.instrument.overrides`): PyTorch's and
#: tf.data's before their instrumentation (which then sees the program's call sites), Keras' after
#: (its ``fit`` wrapper then records the trial's batch size).
_override_torch = _installer("overrides", "install_torch", "Trial settings (PyTorch)")
_override_tf = _installer("overrides", "install_tf", "Trial settings (tf.data)")
_override_keras = _installer("overrides", "install_keras", "Trial settings (Keras)")
_install_keras = _then(_installer("keras", "install_keras", "Keras"), _override_keras)
_install_lightning = _then(_installer("frameworks", "install_lightning", "Lightning"),
                           _installer("overrides", "install_lightning", "Trial settings (Lightning)"))
#: Framework modules whose import installs their instrumentation (post-import hooks). The HF
#: ``Trainer`` is hooked at its own submodule: ``transformers`` imports it lazily, and importing it
#: for a program that only builds models would cost seconds.
#: torch.compile's frame evaluator: before it imports, the Module.__call__ wrapper goes in
#: (TorchDynamo keeps the __call__ it finds as PyTorch's own); after, whyidle's frames are skipped.
_install_dynamo = _then(_installer("forward", "install_dynamo", "torch.compile support"),
                        _installer("compile", "install", "torch.compile timing"))
_install_dynamo.before = lambda: importlib.import_module("whyidle.instrument.forward").put_in()
_INSTALLERS = {"torch": _then(_override_torch, _installer("torch", "install", "PyTorch")),
               "tensorflow": _then(_override_tf, _installer("keras", "install_tensorflow", "TensorFlow")),
               "keras": _install_keras,
               "tf_keras": _install_keras,  # tf_keras: Keras 2 behind tf.keras with TF_USE_LEGACY_KERAS=1
               "lightning": _install_lightning,
               "pytorch_lightning": _install_lightning,
               "transformers.trainer": _installer("frameworks", "install_transformers_trainer", "Hugging Face Trainer"),
               "transformers.training_args": _installer("overrides", "install_hf_args", "Trial settings (HF)"),
               "accelerate": _installer("frameworks", "install_accelerate", "Accelerate"),
               "torch._dynamo": _install_dynamo}
#: Trackers and checkpoint writers whose calls are timed as logging / checkpoint regions.
for _name in ("torch.utils.tensorboard", "wandb", "mlflow", "safetensors.torch", "transformers.modeling_utils"):
    _INSTALLERS[_name] = _installer("frameworks", "install_regions", f"{_name} timing")


def start_from_env() -> "Agent | None":
    """Creates the process's agent from ``WHYIDLE_*`` environment variables (idempotent).

    Reads ``WHYIDLE_RUN_DIR`` (required), ``WHYIDLE_STACK_HZ`` (Hz, default
    :data:`DEFAULT_STACK_HZ`) and :data:`READER_ENV` (the reader to watch; not watched when it
    cannot be seen now). Returns ``None`` when ``WHYIDLE_RUN_DIR`` is unset.
    """
    if _AGENT is not None:
        return _AGENT
    run_dir = os.environ.get("WHYIDLE_RUN_DIR")
    if not run_dir:
        return None
    try:
        stack_hz = float(os.environ.get("WHYIDLE_STACK_HZ", DEFAULT_STACK_HZ))
    except ValueError:
        stack_hz = DEFAULT_STACK_HZ
    reader = os.environ.get(READER_ENV) or None
    if reader and not reader_alive(reader):
        reader = None  # gone already, or hidden from us (/proc mounted hidepid): never stop for it
    return start(run_dir, stack_hz, reader)


def start(run_dir: str, stack_hz: float = DEFAULT_STACK_HZ, reader: str | None = None) -> Agent:
    """Observes this process from now on, recording into ``run_dir`` (an existing directory):
    the frameworks already imported are instrumented now, the others when imported.
    :meth:`Agent.stop` ends it. ``stack_hz``: stack samples of the training thread per second
    (0: none); ``reader``: a :data:`READER_ENV` token (recording stops once that process is gone).

    Errors: ``RuntimeError`` when the process is observed already (by ``whyidle run`` or another
    watch); ``OSError`` from creating nothing yet (the file is opened at the first flush).
    """
    global _AGENT
    if _AGENT is not None:
        raise RuntimeError(f"this process is observed already (run directory {_AGENT.run_dir})")
    _AGENT = Agent(run_dir, stack_hz, reader)
    from whyidle.instrument import cells

    cells.install(_AGENT)  # a notebook kernel's cells: "cell N, line L" in the findings
    pending = {}
    for name, install in _INSTALLERS.items():
        if name in sys.modules:  # started late (e.g. by whyidle.watch()): instrument now
            install(sys.modules[name])
        else:
            pending[name] = install
    if pending:
        sys.meta_path.insert(0, _PostImportHook(pending))
    return _AGENT


def _forked() -> None:
    # A forked child (e.g. a DataLoader worker) shares our hooks but not our threads: it must
    # neither write the parent's file nor run half-initialized (registered once per process:
    # os.register_at_fork has no way back, and a stopped agent leaves nothing to disable).
    if _AGENT is not None:
        _AGENT._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _say(msg: str) -> None:
    """One ``[whyidle]`` line on stderr (never on stdout: it is the program's); never raises."""
    try:
        sys.stderr.write(f"[whyidle] {msg}\n")
    except Exception:
        pass


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22).

    Returns None when there is no such process, it has exited (a zombie not yet reaped), or
    ``/proc`` cannot be read (not Linux). One read of a small file, ~20 µs.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        if fields[0] in (b"Z", b"X"):
            return None
        return int(fields[19])  # field 3 (state) is fields[0]
    except (OSError, IndexError, ValueError):
        return None


def reader_token(pid: int | None = None) -> str | None:
    """The :data:`READER_ENV` value naming process ``pid`` (default: this one): ``"<pid>:<start
    ticks>"``; None where its start time cannot be read (then nothing is watched)."""
    pid = os.getpid() if pid is None else pid
    start = process_start_ticks(pid)
    return None if start is None else f"{pid}:{start}"


def reader_alive(token: str) -> bool:
    """Whether the process a :func:`reader_token` names still runs (the same pid with the same
    start time, not a zombie). A token that does not parse counts as alive: never stop for it."""
    try:
        pid, start = (int(x) for x in token.split(":"))
    except ValueError:
        return True
    return process_start_ticks(pid) == start


def current() -> "Agent | None":
    """The process's agent, or ``None`` when the process is not observed."""
    return _AGENT
