"""Reports of the golden runs and of synthetic long runs equal the snapshot taken before the fast
reading and analysis paths (tests/report_parity.py): same verdict, findings and metrics, shares
within 0.5 pp."""

from __future__ import annotations

import json

import pytest
import report_parity

from whyidle.record import intcolumn


@pytest.mark.parametrize("chunk_bits", [16, 7])  # 7: step columns sealed every 128 rows
def test_reports_equal_the_snapshot(tmp_path, monkeypatch, chunk_bits):
    monkeypatch.setattr(intcolumn, "CHUNK_BITS", chunk_bits)
    monkeypatch.setattr(intcolumn, "CHUNK", 1 << chunk_bits)
    monkeypatch.setattr(intcolumn, "_MASK", (1 << chunk_bits) - 1)
    with open(report_parity.SNAPSHOT) as f:
        want = json.load(f)
    got = {name: report_parity.digest(r) for name, r in report_parity.reports(str(tmp_path)).items()}
    assert sorted(got) == sorted(want)
    diffs = [f"{name}{d}" for name in want for d in report_parity.differences(want[name], got[name])]
    assert not diffs, diffs


def test_the_comparison_sees_a_moved_share_and_a_changed_verdict():
    a = {"verdict": "input_bound", "shares": {"data_wait": 0.40}, "metrics": {"steps": 100}}
    assert report_parity.differences(a, json.loads(json.dumps(a))) == []
    assert report_parity.differences(a, {**a, "shares": {"data_wait": 0.404}}) == []
    assert report_parity.differences(a, {**a, "shares": {"data_wait": 0.41}}) == [".shares.data_wait: 0.4 → 0.41"]
    assert report_parity.differences(a, {**a, "verdict": "host_bound"})
    assert report_parity.differences(a, {**a, "metrics": {"steps": 101}})
