"""Stack samples of a process's start-up: from the framework's import to the first training activity.

The training thread's own sampler (:class:`whyidle.instrument.stacks.StackSampler` in signal
mode) starts with the first batch, forward or optimizer step. What a program does before that —
importing its packages, reading and tokenizing a corpus, decoding images into memory, building the
model — is sampled here: a thread reads the main thread's frame ``STARTUP_HZ`` times per second
and counts it under the phase ``"setup"`` (``"import"`` while a library is being imported,
``"framework"`` once the program called a training framework's entry point: :func:`entered`). Its counts stay in memory until the process starts
training; then the sampler stops and its counts become one ``stacks`` record (the analysis splits
the start-up with it: :func:`whyidle.analysis.accounting.startup_split`). A process that never
trains (a spawned DataLoader worker, a launcher, a compile worker) writes nothing of it.

Cost: ``STARTUP_HZ`` samples of one frame chain per second (~20 µs each: ~0.05 % of a core), in a
thread (no signal: a process that only imports a framework gets no timer and no handler). It stops
at once in a DataLoader worker (``until``), and otherwise at the first training activity or exit.
"""

from __future__ import annotations

import threading

#: Samples per second of the start-up: a 2-s set-up gets 40, enough for its lines
#: (``whyidle.analysis.stacks.MIN_SITE_SAMPLES``) at a cost a helper process never notices.
STARTUP_HZ = 20.0
PHASE = "setup"
#: The phase of a start-up sample taken while a library is being imported.
IMPORT_PHASE = "import"
#: The phase once the program called a training framework's entry point (``Trainer.fit``,
#: ``Trainer.train``, Keras ``fit``): the framework's own start before its first step.
FRAMEWORK_PHASE = "framework"
#: The program's frames kept per sample: deep enough to reach the set-up's call in ``main()`` from
#: a tokenizer's inner helper (the line a cache goes around, ``startup_split``'s ``entry``).
USER_FRAMES = 10


class StartupSampler:
    """Samples the main thread from now until :meth:`hand_over` or :meth:`stop`.

    Args:
        agent: the process's :class:`whyidle.instrument.agent.Agent` (``record``, ``notice``).
        until: ``until()`` true ends the sampling without a record (the process is a helper, such
            as a DataLoader worker); None never.
    """

    def __init__(self, agent, until=None) -> None:
        from whyidle.instrument.stacks import StackSampler

        self.agent = agent
        self._lock = threading.Lock()
        self._done = False
        self.phase = PHASE
        self.sampler = StackSampler(threading.main_thread().ident, STARTUP_HZ, lambda: self.phase, native_id=None,
                                    notify=agent.notice, until=until,
                                    import_phase=IMPORT_PHASE, user_frames=USER_FRAMES)
        self.sampler.start()

    def hand_over(self) -> None:
        """Stops sampling and records what was counted (one ``stacks`` record with ``"startup":
        true``); the training thread's sampler takes over. Idempotent; never raises."""
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            self.sampler.stop()
            for rec in self.sampler.drain():
                rec["startup"] = True
                self.agent.record(rec)
        except Exception:
            pass

    def stop(self) -> None:
        """Stops sampling without a record (exit of a process that never trained)."""
        with self._lock:
            self._done = True
        self.sampler.stop()


def start(agent, until=None) -> StartupSampler | None:
    """The agent's start-up sampler, started on the first call (None when stack sampling is off:
    ``agent.stack_hz`` ≤ 0)."""
    if agent.stack_hz <= 0:
        return None
    if getattr(agent, "startup", None) is None:
        agent.startup = StartupSampler(agent, until)
        agent.on_exit.append(agent.startup.stop)
    return agent.startup


def entered(agent) -> None:
    """The program called a training framework's entry point: later start-up samples are the
    framework's own start (phase :data:`FRAMEWORK_PHASE`)."""
    sampler = getattr(agent, "startup", None)
    if sampler is not None:
        sampler.phase = FRAMEWORK_PHASE


def hand_over(agent) -> None:
    """The first training activity: the start-up sampler's counts are recorded and it stops."""
    sampler = getattr(agent, "startup", None)
    if sampler is not None:
        sampler.hand_over()
