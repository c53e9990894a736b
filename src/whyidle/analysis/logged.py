"""``metric`` records → the metrics a run reported (pure).

Sources: ``whyidle.log_metric(name, value)`` in the user's code, and Keras's epoch-end logs (what
``History`` holds). A name reported by both keeps the ``log_metric`` values.
"""

from __future__ import annotations


def logged_metrics(procs: dict[int, list[dict]]) -> dict[str, dict]:
    """Per metric name, its values over the run.

    Args:
        procs: pid → records (``RunData.procs``).
    Returns:
        ``{name: {"last", "first", "min", "max"`` (finite values only; None when none was
        finite), ``"count"``, ``"source"`` (``"log_metric"`` or ``"keras"``), ``"step"`` /
        ``"epoch"`` (of the last value, None when not given), ``"n"`` (examples behind the last value,
        from ``log_metric(..., n=)``), ``"values"`` (list of ``[t_ns,
        value]`` in time order)``}}``, names sorted.
    """
    by_name: dict[str, list[dict]] = {}
    for records in procs.values():
        for r in records:
            if r.get("k") == "metric" and isinstance(r.get("name"), str):
                by_name.setdefault(r["name"], []).append(r)
    out = {}
    for name in sorted(by_name):
        recs = by_name[name]
        if any(r.get("source") == "log_metric" for r in recs):
            recs = [r for r in recs if r.get("source") == "log_metric"]
        recs.sort(key=lambda r: r.get("t") or 0)
        finite = [r["value"] for r in recs if isinstance(r.get("value"), (int, float))]
        last = recs[-1]
        out[name] = {
            "last": last.get("value"), "first": recs[0].get("value"),
            "min": min(finite) if finite else None, "max": max(finite) if finite else None,
            "count": len(recs), "source": last.get("source"), "step": last.get("step"), "epoch": last.get("epoch"),
            "n": last.get("n"),
            "values": [[r.get("t"), r.get("value")] for r in recs],
        }
    return out
