"""`whyidle demo`: real photos, a beginner's pipeline diagnosed input-bound, the fix measurably faster."""

from __future__ import annotations

import glob
import json
import os
import re

import pytest
from PIL import Image

from conftest import run_whyidle
from whyidle.demo.data import CROP_SIZE, CROPS_PER_PHOTO, ensure_images

pytestmark = [pytest.mark.slow]


def test_image_folder_is_cut_from_the_sklearn_photos(tmp_path):
    root, count = ensure_images(str(tmp_path / "img"))
    assert count == 2 * CROPS_PER_PHOTO
    assert sorted(d for d in os.listdir(root) if not d.startswith(".")) == ["china", "flower"]  # a class per photo
    files = glob.glob(os.path.join(root, "*", "*.jpg"))
    assert len(files) == count
    with Image.open(files[0]) as im:
        assert im.format == "JPEG" and im.size == (CROP_SIZE, CROP_SIZE)
        assert len(im.convert("L").getcolors(256)) > 50  # a photo, not a flat synthetic image
    assert ensure_images(root) == (root, count)  # cached: not rebuilt


@pytest.mark.timing
def test_demo_finds_input_bound_and_the_fix_is_faster(tmp_path):
    proc = run_whyidle(["demo", "--out", str(tmp_path / "runs"), "--data", str(tmp_path / "img"), "--steps", "40"],
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before_dir = glob.glob(str(tmp_path / "runs" / "*-demo-before"))[0]
    after_dir = glob.glob(str(tmp_path / "runs" / "*-demo-after"))[0]
    with open(os.path.join(before_dir, "report.json")) as f:
        before = json.load(f)
    with open(os.path.join(after_dir, "report.json")) as f:
        after = json.load(f)
    assert before["verdict"] == "input_bound"
    ib = next(f for f in before["findings"] if f["id"] == "input_bound")
    assert ib["evidence"]["cause"] == "loader_in_main_process"
    assert after["loader"]["num_workers"] == ib["evidence"]["suggested_num_workers"]  # the report's fix was applied
    assert after["metrics"]["shares"]["data_wait"] < before["metrics"]["shares"]["data_wait"] / 2
    # the fix makes the step faster (steady samples/s, what `whyidle compare` below measures) on a
    # machine that gives the run its cores; where other tenants took them (seen in CI: the trainer
    # got 0.5 of a core beside its worker), the after run's report must say so instead (a warning:
    # the 10-20 % CPU steal this VM sees for minutes at a time is an info note and leaves 1.15x)
    if not any(f["id"] == "cpu_contention" and f["severity"] != "info" for f in after["findings"]):
        assert after["metrics"]["steady_samples_per_s"] >= 1.15 * before["metrics"]["steady_samples_per_s"]
    # the demo ends with `whyidle compare` of its two runs: the speed-up with its interval
    assert "speed-up vs A" in proc.stdout
    assert re.search(r"B \(demo-after\) is \d+\.\d\d× faster than A \(demo-before\) \(95 % CI "
                     r"\d+\.\d\d–\d+\.\d\d within these runs\)", " ".join(proc.stdout.split())), proc.stdout[-2000:]
    # the training script reported its validation accuracy (whyidle.log_metric, n = held-out images)
    assert before["logged_metrics"]["val_accuracy"]["n"] == 160
    assert 0.5 <= after["logged_metrics"]["val_accuracy"]["last"] <= 1
    for run_dir in (before_dir, after_dir):  # both HTML reports and timelines are written
        assert os.path.getsize(os.path.join(run_dir, "report.html")) > 100_000
        assert os.path.getsize(os.path.join(run_dir, "timeline.json")) > 1000
