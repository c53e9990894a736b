"""In-process units of the CUDA-side instrumentation: SyncWatch, the transfer/read audit and the
placement watch, on CPU torch with fakes for what needs CUDA."""

from __future__ import annotations

import sys
import threading
import types
import warnings

import pytest
import torch

from whyidle.instrument.cuda import SYNC_WARNING, SyncWatch
from whyidle.instrument.stacks import FrameClassifier
from whyidle.instrument.transfers import TransferAudit, watch_placement

SITE_OF = FrameClassifier().site_pair


class Mode:
    def __init__(self, value=0):
        self.value = value

    def get(self):
        return self.value

    def set(self, v):
        self.value = v


def test_sync_watch_counts_flagged_syncs_and_prints_nothing(capsys):
    mode = Mode()
    seen = []
    watch = SyncWatch(mode.get, mode.set, lambda frame, explicit: seen.append((SITE_OF(frame)[0], explicit)))
    assert watch.install()
    try:
        assert mode.value == 1
        for _ in range(3):  # the same line three times: Python's once-per-line registry must not hide repeats
            warnings.warn(SYNC_WARNING)
        with warnings.catch_warnings(record=True) as others:  # other warnings pass through
            warnings.simplefilter("always")
            warnings.warn("an unrelated warning")
        assert [str(w.message) for w in others] == ["an unrelated warning"]
    finally:
        watch.uninstall()
    assert mode.value == 0
    assert len(seen) == 3
    assert seen[0][0].startswith("tests/test_cuda_instrument.py:") or "test_cuda_instrument.py:" in seen[0][0]
    assert seen[0][1] is None
    assert SYNC_WARNING not in capsys.readouterr().err


def test_sync_watch_is_not_fooled_by_a_user_showwarning_or_record():
    mode = Mode()
    seen = []
    watch = SyncWatch(mode.get, mode.set, lambda frame, explicit: seen.append(explicit))
    watch.install()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.warn(SYNC_WARNING)
        assert caught == []  # the user's recorded warnings do not see ours
        assert len(seen) == 1
    finally:
        watch.uninstall()


def test_sync_watch_steps_aside_when_the_user_set_a_mode():
    mode = Mode(2)
    watch = SyncWatch(mode.get, mode.set, lambda *a: None)
    assert not watch.install()
    assert mode.value == 2
    assert warnings._showwarnmsg is not watch._showwarnmsg


def test_sync_watch_wraps_explicit_syncs_with_start_and_end():
    mode = Mode()
    events = []
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        synchronize=lambda device=None: (events.append("sync"), warnings.warn(SYNC_WARNING)),
        Event=type("Event", (), {"synchronize": lambda self: events.append("event-sync")})))
    watch = SyncWatch(mode.get, mode.set, lambda frame, explicit: events.append(("end", explicit)),
                      lambda frame: events.append("start"))
    watch.install(fake_torch)
    try:
        fake_torch.cuda.synchronize()
        fake_torch.cuda.Event().synchronize()
    finally:
        watch.uninstall()
    # the warning raised inside the explicit sync is not counted twice
    assert events == ["start", "sync", ("end", "torch.cuda.synchronize"),
                      "start", "event-sync", ("end", "Event.synchronize")]
    assert fake_torch.cuda.synchronize.__name__ == "<lambda>"  # restored


def test_sync_watch_survives_a_failing_callback():
    mode = Mode()

    def boom(frame, explicit):
        raise RuntimeError("bug in whyidle")

    watch = SyncWatch(mode.get, mode.set, boom)
    watch.install()
    try:
        warnings.warn(SYNC_WARNING)  # must not raise into the user's code
    finally:
        watch.uninstall()


@pytest.fixture()
def audit():
    a = TransferAudit(torch, threading.get_ident(), SITE_OF, threading.get_ident)
    a.start()
    yield a
    a.stop()
    assert "to" not in torch.Tensor.__dict__ and "item" not in torch.Tensor.__dict__


def test_transfer_audit_records_copies_to_a_device(audit):
    x = torch.ones(8, 4)  # 128 bytes
    audit.add_batch(x)
    x.to("meta")
    x.to("meta", non_blocking=True)
    torch.arange(3).to(device="meta")  # built on the CPU in the step: not from the batch
    x.to(torch.float64)  # a dtype change: not a copy to a device
    x.to("cpu")  # a batch "moved" to the CPU: kept as intent
    rec = audit.drain(4, 123)
    assert rec["k"] == "transfers" and rec["step"] == 4 and rec["t"] == 123
    rows = {(r[2], r[4], r[5]): r for r in rec["items"]}
    assert set(rows) == {("meta", False, True), ("meta", True, True), ("meta", False, False), ("cpu", False, True)}
    site, leaf, dev, pinned, nb, from_batch, count, nbytes, host_ns = rows[("meta", False, True)]
    assert site.endswith("test_transfer_audit_records_copies_to_a_device") and pinned is False
    assert (count, nbytes) == (1, 128) and host_ns > 0
    assert rows[("meta", False, False)][7] == 24  # 3 int64
    assert audit.drain(5, 0)["items"] == []  # reset per step


def test_read_audit_counts_outermost_reads_per_line(audit):
    x = torch.ones(4, 4)
    x.sum().item()
    x.cpu().numpy()
    print(x)  # one read, not the dozens inside tensor formatting
    if x.sum():
        pass
    reads = audit.drain(0, 0)["reads"]
    ops = sorted(r[2] for r in reads)
    assert ops == ["__bool__", "__repr__", "cpu", "item", "numpy"]
    assert all(r[3] == 1 for r in reads)
    assert all("test_cuda_instrument.py" in r[0] for r in reads)


def test_audit_ignores_other_threads(audit):
    t = threading.Thread(target=lambda: torch.ones(2).to("meta").sum())
    t.start()
    t.join()
    x = torch.ones(2)
    threading.Thread(target=x.tolist).start()
    assert audit.drain(0, 0) == {"k": "transfers", "t": 0, "step": 0, "items": [], "reads": []}


def test_watch_placement_records_module_moves_and_cuda_queries(monkeypatch):
    recs = []
    monkeypatch.setattr(torch.nn.Module, "to", torch.nn.Module.to)
    monkeypatch.setattr(torch.nn.Module, "cuda", torch.nn.Module.cuda)
    monkeypatch.setattr(torch.cuda, "is_available", torch.cuda.is_available)
    watch_placement(torch, recs.append, SITE_OF)
    model = torch.nn.Linear(2, 2)
    model.to("meta")
    model.to(torch.float64)  # dtype only: no record
    available = torch.cuda.is_available()
    kinds = [(r["k"], r.get("device"), r.get("result")) for r in recs]
    assert kinds == [("module_to", "meta", None), ("cuda_query", None, available)]
    assert recs[0]["cls"] == "Linear" and "test_cuda_instrument.py" in recs[0]["site"]


def test_watch_placement_ignores_library_queries(monkeypatch):
    recs = []
    monkeypatch.setattr(torch.cuda, "is_available", torch.cuda.is_available)
    monkeypatch.setattr(torch.nn.Module, "to", torch.nn.Module.to)
    monkeypatch.setattr(torch.nn.Module, "cuda", torch.nn.Module.cuda)
    watch_placement(torch, recs.append, SITE_OF)
    lib = types.ModuleType("somelib")
    code = compile("def check(torch):\n    return torch.cuda.is_available()\n",
                   f"{sys.prefix}/lib/python3.11/site-packages/somelib/__init__.py", "exec")
    exec(code, lib.__dict__)
    lib.check(torch)
    assert recs == []


def test_reads_made_inside_a_library_are_not_counted(audit):
    # e.g. torch.optim.Adam reading its CPU step counter: not the user's read, and no GPU sync
    lib = types.ModuleType("somelib")
    code = compile("def step(t):\n    return t.item()\n",
                   f"{sys.prefix}/lib/python3.11/site-packages/somelib/__init__.py", "exec")
    exec(code, lib.__dict__)
    lib.step(torch.ones(()))
    torch.ones(()).item()
    reads = audit.drain(0, 0)["reads"]
    assert len(reads) == 1 and "test_cuda_instrument.py" in reads[0][0]


def test_the_demo_trainer_is_user_code():
    from whyidle.demo import train

    kind, label = FrameClassifier().classify(train.__file__)
    assert kind == 0 and label == "whyidle/demo/train.py"
