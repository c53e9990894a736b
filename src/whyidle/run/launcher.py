"""Launching an observed command: bootstrap injection, signal forwarding, exit status.

The command runs unchanged, with the same stdin/stdout/stderr (inherited file descriptors, so a
TTY stays a TTY). Every Python process it starts is instrumented through a ``sitecustomize``
bootstrap put first on ``PYTHONPATH`` — the mechanism ``ddtrace-run`` and
``opentelemetry-instrument`` use — which chains to any ``sitecustomize`` it shadows.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time

import whyidle
from whyidle.record.writer import atomic_file
from whyidle.redact import redact_argv

BOOTSTRAP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap", "sitecustomize.py")
PACKAGE_DIR = os.path.dirname(os.path.abspath(whyidle.__file__))

#: Signals passed on to the command. SIGINT and SIGQUIT are only passed on when they did not come
#: from the terminal: a terminal sends them to the whole foreground process group, command included.
#: When whyidle passes them on, it sends them to every process of the command's tree, as a
#: terminal would (a shell script waiting for python does not pass SIGINT on by itself).
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
_TERMINAL_SIGNALS = ("SIGINT", "SIGQUIT")

#: Signals after which whyidle exits with 128 + N instead of re-raising them on itself (they would
#: make whyidle dump core).
_CORE_SIGNALS = ("SIGQUIT", "SIGILL", "SIGABRT", "SIGFPE", "SIGSEGV", "SIGBUS", "SIGSYS", "SIGTRAP")


class LaunchError(Exception):
    """The command cannot be started; ``exit_code`` is what whyidle should exit with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def resolve_command(cmd: list[str]) -> str:
    """Returns the executable path for ``cmd[0]``.

    Errors:
        LaunchError: exit code 127 when not found (as a shell does), 126 when not executable.
    """
    name = cmd[0]
    shown = redact_argv([name])[0]  # ``whyidle run -- HF_TOKEN=x python t.py`` names no secret
    if os.sep in name:
        if not os.path.exists(name):
            raise LaunchError(f"command not found: {shown}", 127)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise LaunchError(f"permission denied (not an executable file): {shown}", 126)
        return name
    path = shutil.which(name)
    if path is None:
        raise LaunchError(f"command not found: {shown}", 127)
    return path


def prepare_bootstrap(run_dir: str) -> str:
    """Creates ``RUN_DIR/.bootstrap`` holding the bootstrap and a link to this whyidle package.

    The link makes ``import whyidle`` resolve to this very installation in every child Python
    (even another interpreter or virtual environment) without exposing any other package.
    Returns the directory to put first on ``PYTHONPATH``, absolute: a command that changes
    directory (``cd src && python train.py``) must still find it.
    """
    boot = os.path.join(os.path.abspath(run_dir), ".bootstrap")
    os.makedirs(boot, mode=0o700, exist_ok=True)
    with open(BOOTSTRAP_FILE, "rb") as src, atomic_file(os.path.join(boot, "sitecustomize.py")) as dst:
        shutil.copyfileobj(src, dst)  # created 0600 like every file of the run directory
    link = os.path.join(boot, "whyidle")
    if not os.path.lexists(link):
        os.symlink(PACKAGE_DIR, link)
    return boot


def child_env(run_dir: str, bootstrap_dir: str, stack_hz: float, base: dict | None = None) -> dict:
    """The command's environment: ``base`` (default ``os.environ``) plus the bootstrap.

    Sets ``WHYIDLE_RUN_DIR``, ``WHYIDLE_STACK_HZ`` (Hz) and ``WHYIDLE_READER`` (this process, the
    run's reader: the agents stop recording once it is gone, :data:`whyidle.instrument.agent.READER_ENV`)
    and prepends ``bootstrap_dir`` to ``PYTHONPATH``, keeping the user's entries after it.
    """
    from whyidle.instrument.agent import READER_ENV, reader_token

    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.path.abspath(bootstrap_dir) + (os.pathsep + old if old else "")
    env["WHYIDLE_RUN_DIR"] = os.path.abspath(run_dir)
    env["WHYIDLE_STACK_HZ"] = str(stack_hz)
    reader = reader_token()
    if reader:
        env[READER_ENV] = reader
    else:  # not Linux: nothing to watch (an inherited value would name another whyidle)
        env.pop(READER_ENV, None)
    return env


def become_subreaper() -> bool:
    """Makes orphaned descendants re-parent to this process (Linux ``PR_SET_CHILD_SUBREAPER``).

    That keeps a trainer started by a shell script that exits early inside the observed tree.
    Returns False where unsupported.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except Exception:
        return False


def reap_orphans(child_pid: int) -> None:
    """Reaps exited re-parented descendants (zombies), never the command itself."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, OSError):
            return
        if info is None or info.si_pid == child_pid:
            return
        try:
            os.waitpid(info.si_pid, 0)
        except ChildProcessError:
            return


@dataclasses.dataclass
class ChildExit:
    """How the command ended: ``exit_code`` (None when a signal ended it), ``signal`` number."""

    exit_code: int | None
    signal: int | None
    interrupted: bool

    def whyidle_exit(self) -> None:
        """Exits this process the way the command ended: the same exit code, or the same signal.

        A signal ``N`` — any number, real-time signals included — is re-raised on whyidle itself
        with its default action, except the core-dumping ones (:data:`_CORE_SIGNALS`), after which
        whyidle exits with ``128 + N`` (the shell's convention); so does it when the re-raised
        signal does not end it (ignored or blocked by our parent). Raises only ``SystemExit``.
        """
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if self.signal is None:
            sys.exit(self.exit_code)
        signum = self.signal
        try:
            if signal_name(signum) not in _CORE_SIGNALS:
                try:
                    signal.signal(signum, signal.SIG_DFL)
                except (OSError, ValueError, TypeError):
                    pass  # SIGKILL and SIGSTOP cannot be handled: they are default already
                os.kill(os.getpid(), signum)
        except Exception:
            pass
        sys.exit(128 + signum)


def signal_name(signum: int) -> str:
    """``"SIGINT"`` for 2, ``"SIGRTMIN+4"`` for a real-time signal, else ``"signal N"``; never
    raises (``signal.Signals(N)`` raises ``ValueError`` for real-time signals)."""
    try:
        return signal.Signals(signum).name
    except (ValueError, TypeError):
        pass
    rtmin, rtmax = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if isinstance(signum, int) and rtmin is not None and rtmax is not None and rtmin <= signum <= rtmax:
        return f"SIGRTMIN+{signum - rtmin}"
    return f"signal {signum}"


#: Seconds a command stopped by :meth:`Child.stop` gets to end on SIGINT before SIGTERM, and
#: on SIGTERM before SIGKILL: a training loop ends its step, runs ``finally`` blocks and atexit
#: handlers (the agents' last flush takes at most a second) well within it.
STOP_GRACE_S = 5.0


class Child:
    """The running command, with signal forwarding installed while it runs.

    Args:
        cmd: argv of the command (``cmd[0]`` already resolved by :func:`resolve_command`).
        env: its environment.
    Errors: ``OSError`` from ``subprocess.Popen`` (e.g. exec format error).
    """

    def __init__(self, cmd: list[str], env: dict, output=None) -> None:
        self.interrupted = False
        self._tty = _open_tty()
        self._saved = {}
        self._stopping: tuple[float, int] | None = None  # (when, signal sent last) once stop() was called
        self.proc = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT if output else None)
        for name in FORWARDED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._saved[sig] = signal.signal(sig, self._on_signal)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _on_signal(self, signum, frame) -> None:
        try:  # a signal handler must not raise: the exception would surface anywhere in whyidle
            if signum == signal.SIGINT:
                self.interrupted = True
            interactive = signal_name(signum) in _TERMINAL_SIGNALS
            if interactive and self._from_terminal():
                return
            self._signal_tree(signum, tree=interactive)
        except Exception:
            pass

    def stop(self) -> None:
        """Stops the command gently, as Ctrl-C would: SIGINT to it and its descendants (the program
        ends its loop, its ``finally`` blocks and atexit handlers run and the agents write their
        last records); :meth:`escalate` follows with SIGTERM and then SIGKILL if it lingers. A
        command that ignores SIGINT (started from ``nohup`` or a background job of a script, which
        ignore it, as its children inherit) gets SIGTERM at once."""
        first = signal.SIGTERM if ignores(self.proc.pid, signal.SIGINT) else signal.SIGINT
        self._stopping = (time.monotonic(), first)
        self._signal_tree(first)

    def escalate(self) -> None:
        """After :meth:`stop`: SIGTERM once the command has had :data:`STOP_GRACE_S` seconds to
        end on SIGINT, SIGKILL after as many more. Call it periodically; does nothing otherwise."""
        if self._stopping is None or self.proc.poll() is not None:
            return
        since, sent = self._stopping
        if time.monotonic() - since < STOP_GRACE_S or sent == signal.SIGKILL:
            return
        nxt = signal.SIGTERM if sent == signal.SIGINT else signal.SIGKILL
        self._stopping = (time.monotonic(), nxt)
        self._signal_tree(nxt)

    def _signal_tree(self, signum: int, tree: bool = True) -> None:
        """Sends ``signum`` to the command, and to its descendants too with ``tree``."""
        targets = [self.proc.pid]
        if tree:
            try:
                import psutil

                targets += [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
            except Exception:
                pass
        for pid in targets:
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def _from_terminal(self) -> bool:
        if self._tty is None:
            return False
        try:
            return os.tcgetpgrp(self._tty) == os.getpgrp()
        except OSError:
            return False

    def wait(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` seconds; True when the command has ended."""
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def exit_status(self) -> ChildExit:
        rc = self.proc.returncode
        if rc is not None and rc < 0:
            return ChildExit(None, -rc, self.interrupted)
        return ChildExit(rc, None, self.interrupted)

    def restore_signals(self) -> None:
        """Puts back the handlers that were there before (call it after the report is written:
        until then a second Ctrl-C only reaches the finished command, not the report)."""
        for sig, old in self._saved.items():
            try:
                signal.signal(sig, old)
            except (OSError, ValueError, TypeError):
                pass  # old is None: a handler set outside Python, which cannot be put back
        if self._tty is not None:
            try:
                os.close(self._tty)
            except OSError:
                pass
            self._tty = None


def ignores(pid: int, signum: int) -> bool:
    """Whether process ``pid`` ignores signal ``signum`` (``SigIgn`` of ``/proc/<pid>/status``);
    False when unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigIgn:")).split()[1]
        return bool(int(mask, 16) >> (signum - 1) & 1)
    except (OSError, StopIteration, ValueError, IndexError):
        return False


def _open_tty() -> int | None:
    try:
        return os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return None
