"""One job's node runs reported as one job (record/merge.py, ``whyidle report DIR DIR``)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from conftest import observe, run_whyidle
from synthetic_run import write_job, write_run

from whyidle.pipeline import analyze_run
from whyidle.record.reader import RunDirError

SCENARIOS = os.path.join(os.path.dirname(__file__), "scenarios")


def test_node_runs_merge_into_one_job_with_the_late_ranks_node_described(tmp_path):
    dirs = write_job(tmp_path, nodes=2, ranks_per_node=2, late=3)
    a = analyze_run(dirs)
    ranks = a.facts.ranks
    assert [(r["rank"], r["node"]) for r in ranks] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert len({r["pid"] for r in ranks}) == 4  # the same pids on both nodes stay apart
    assert a.facts.straggler["rank"] == 3 and a.facts.straggler["measured"]
    assert a.run.path == dirs[1]  # the machine samples of the late rank's node
    assert any(f["id"] == "imbalance" for f in a.findings)
    one = analyze_run(dirs[0])  # one node alone: its two ranks, balanced
    assert [r["rank"] for r in one.facts.ranks] == [0, 1] and one.facts.straggler is None


def test_a_merged_report_says_how_to_render_it_again(tmp_path):
    dirs = write_job(tmp_path, nodes=2, ranks_per_node=2, late=3)
    out = subprocess.run([sys.executable, "-m", "whyidle", "report", *dirs], capture_output=True, text=True,
                         env=dict(os.environ, COLUMNS="400"), check=True).stdout
    assert f"re-render: whyidle report {dirs[0]} {dirs[1]}" in out and f"described: {dirs[1]}" in out


def test_runs_of_different_jobs_or_the_same_node_twice_are_refused(tmp_path):
    a = write_job(tmp_path / "a", nodes=2, ranks_per_node=1)
    b = write_job(tmp_path / "b", nodes=2, ranks_per_node=1)
    with pytest.raises(RunDirError, match="node 0 is also in"):
        analyze_run([a[0], b[0]])
    path = os.path.join(b[1], "proc-%d.jsonl" % 4242)
    with open(path) as f:
        text = f.read().replace('"master_port":29500', '"master_port":29501')
    with open(path, "w") as f:
        f.write(text)
    with pytest.raises(RunDirError, match="not the same job .*master_port 29501 here, 29500 there"):
        analyze_run([a[0], b[1]])
    single = write_run(tmp_path / "single")
    with pytest.raises(RunDirError, match="no torch.distributed ranks"):
        analyze_run([a[0], single])
    proc = run_whyidle(["report", a[0], single])
    assert proc.returncode == 2 and "no torch.distributed ranks" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timing
def test_two_torchrun_nodes_merged_equal_the_one_node_job(tmp_path):
    """Issue 15: two `torchrun --nnodes 2 --node_rank i` on localhost, each under its own
    `whyidle run`, merged, against the same job on one node (rank 1's data is slow)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = [os.path.join(SCENARIOS, "ddp_straggler.py"), "--kind", "loader", "--steps", "40"]
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "whyidle", "run", "-q", "--no-html", "--out", str(tmp_path / f"node{node}"), "--",
               sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--node_rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "merge-test", *script]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    merged = run_whyidle(["report", str(tmp_path / "node0"), str(tmp_path / "node1"), "--json", str(tmp_path / "m.json")])
    assert merged.returncode == 0, merged.stderr[-2000:]
    import json

    with open(tmp_path / "m.json") as f:
        m = json.load(f)
    _, single, _ = observe(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc_per_node", "2", *script], name="single", timeout=240)
    for report in (m, single):
        assert report["verdict"] == "input_bound" and report["straggler"]["rank"] == 1
        assert [r["rank"] for r in report["ranks"]] == [0, 1]
    # c10d rendezvous numbers the nodes by arrival, not by --node_rank: find the dir rank 1 ran in
    late_dir = next(d for d in ("node0", "node1") if any('"rank":1,' in open(f).read()
                                                         for f in glob.glob(str(tmp_path / d / "proc-*.jsonl"))))
    assert [r["node"] for r in m["ranks"]] == [0, 1] and m["run"]["run_dir"] == str(tmp_path / late_dir)
    assert {f["id"] for f in m["findings"]} == {f["id"] for f in single["findings"]}
    assert m["metrics"]["samples_per_s"] == pytest.approx(single["metrics"]["samples_per_s"], rel=0.25)
    assert any("node runs" in n for n in m["notes"])
    # each node's run wrote its ranks' summaries at its end; the merge read them, and reads the
    # same without them
    dirs = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    from whyidle.analysis.ranks import SUMMARY_VERSION
    from whyidle.record import rank_summary

    assert all(len(rank_summary.read(d, SUMMARY_VERSION)) == 1 for d in dirs)
    summed = analyze_run(dirs)
    assert len(summed.run.summaries) == 1 and summed.facts.straggler["rank"] == 1
    for d in dirs:
        os.remove(os.path.join(d, rank_summary.JSON_NAME))
    full = analyze_run(dirs)
    assert not full.run.summaries
    assert (full.facts.straggler, full.verdict, full.findings, full.facts.ranks) == \
        (summed.facts.straggler, summed.verdict, summed.findings, summed.facts.ranks)


def test_a_torchrun_runs_default_name_is_its_script_and_node():
    from whyidle.cmdline import default_name

    assert default_name(["torchrun", "--nnodes", "2", "--node_rank", "1", "train.py", "--lr", "1"]) == "train-node1"
    assert default_name(["torchrun", "--node-rank=0", "jobs/pretrain.py"]) == "pretrain-node0"
    assert default_name([sys.executable, "-m", "torch.distributed.run", "--standalone", "t.py"]) == "t"
    assert default_name(["torchrun", "--help"]) == "torchrun" and default_name(["python", "train.py"]) == "train"
