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
