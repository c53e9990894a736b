"""``imbalance`` for a live ``torch.distributed`` job: the ranks wait for a straggler.

The report of a distributed job describes the straggler (:func:`whyidle.analysis.ranks.straggler`),
so its own findings name *why* it is late; this one says that the other ranks wait for it and how
much. Evidence keys follow the trace reports' ``imbalance`` (diagnose/trace_rules.py).
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose.rules import _ms, _pct, _round, finding
from whyidle.diagnose.types import Finding

DOCS_DDP = "https://pytorch.org/docs/stable/notes/ddp.html"


def imbalance(facts: RunFacts, findings: list[Finding]) -> Finding | None:
    """The ranks wait for a straggler (``facts.straggler``).

    ``bound`` = the straggler's excess share of its step (the job runs at its pace) and
    ``est_speedup`` = 1 / (1 − bound), the job's gain if it did no more than the other ranks. A
    warning, unless one of the straggler's own warning or critical findings holds at least half
    that excess: then its cause is the verdict with its fix, and this finding (info) says who waits.
    """
    s = facts.straggler
    if not s:
        return None
    steps = {str(r["rank"]): r["step_time_s"]["mean"] for r in facts.ranks or []}
    waits = {rank: w / steps[rank] for rank, w in s["wait_s_by_rank"].items() if steps.get(rank)}
    wait_share = sum(waits.values()) / len(waits) if waits else None
    step_s = steps.get(str(s["rank"]))
    forward = "forward" in s.get("waits_in", ())
    outside = "forward and backward" if forward else "backward"
    summary = (f"Rank {s['rank']} is the straggler: its work outside {outside} (data wait, "
               + ("" if forward else "forward, ") + f"optimizer, evaluation, Python) takes {_ms(s['own_s'])} of "
               f"each {_ms(step_s)} step against {_ms(s['others_own_s'])} on the other ranks, which wait for it "
               + ("at the buffer broadcast in forward or the gradient all-reduce in backward" if forward else
                  "at the gradient all-reduce inside their backward")
               + (f" ({_pct(wait_share)} of their step)" if wait_share is not None else "") + ".")
    own = [f for f in findings if f["severity"] != "info" and (f.get("bound") or 0) >= 0.5 * s["excess_share"]]
    if own:
        text = (f"Fix rank {s['rank']}'s own cause: the findings of this report are its own (`{own[0]['id']}` "
                "first); the other ranks speed up with it.")
    else:
        late = next((r for r in facts.ranks or [] if r["rank"] == s["rank"]), None)
        phase, share = max(((k, v) for k, v in (late or {}).get("shares", {}).items()
                            if k not in s.get("waits_in", ("backward",))),
                           key=lambda kv: kv[1], default=("forward", None))
        where = f" ({phase.replace('_', ' ')} takes {_pct(share)} of its step)" if share is not None else ""
        text = (f"Look at what rank {s['rank']} does differently{where}: its data (a shard of longer or costlier samples: "
                "balance them per rank, e.g. bucketing by length), its host work (rank-0-only logging or "
                "evaluation), its device (clocks, placement) or its CPU share.")
    evidence = _round({"straggler_rank": s["rank"], "excess_s": s["excess_s"], "excess_share": s["excess_share"],
                       "own_s": s["own_s"], "others_own_s": s["others_own_s"], "wait_share": wait_share})
    evidence["step_s_by_rank"] = _round(steps)
    evidence["wait_s_by_rank"] = _round(s["wait_s_by_rank"])
    est = 1.0 / (1.0 - min(s["excess_share"], 0.95))
    return finding("imbalance", "info" if own else "warning", "Imbalance: ranks wait for a straggler", summary,
                   evidence, est, text, None, [DOCS_DDP], bound=s["excess_share"])
