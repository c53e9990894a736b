"""whyidle: why is my GPU idle, and what do I change?

Kept import-light on purpose: the bootstrap imports ``whyidle.instrument`` inside every Python
process of an observed command, so this module must not import numpy, rich or any framework.
"""

__version__ = "0.1.0"


def log_metric(name: str, value, step: int | None = None, n: int | None = None) -> bool:
    """Records a metric (e.g. validation accuracy) for ``whyidle compare``; a no-op outside
    ``whyidle run``. See :func:`whyidle.instrument.user_metrics.log_metric`."""
    from whyidle.instrument.user_metrics import log_metric as _log

    return _log(name, value, step, n)


def watch(name: str | None = None, out: str | None = None, stack_hz: float = 100.0, interval_s: float = 0.25,
          html: bool = True, json_path: str | None = None, quiet: bool = False, stream=None):
    """Observes a block or a function of this program and reports on it, as ``whyidle run`` does
    for a whole command::

        with whyidle.watch(name="exp3") as w:
            trainer.fit(model)
        w.report, w.run_dir

    Options as in ``whyidle run``: ``name``, ``out`` (run directory), ``stack_hz`` (Hz),
    ``interval_s`` (host sampling period, seconds), ``html``, ``json_path`` (``"-"``: stdout),
    ``quiet``; the live status and the report go to ``stream`` (default stderr). Every hook of
    whyidle's is taken out of the process at the block's end. See :class:`whyidle.run.watch.Watch`.
    Errors: none of whyidle's (a problem is one ``[whyidle]`` line and the block runs
    unobserved); the block's own exceptions propagate unchanged."""
    from whyidle.run.watch import Watch

    return Watch(name, out, stack_hz, interval_s, html, json_path, quiet, stream)


def load_ipython_extension(ipython) -> None:
    """``%load_ext whyidle``: registers the ``%%whyidle`` cell magic (:mod:`whyidle.run.magic`)."""
    from whyidle.run.magic import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext whyidle``: nothing to undo (each cell takes its own hooks out)."""
