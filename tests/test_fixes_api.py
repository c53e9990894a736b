"""Fix code in the program's own API (diagnose/fixes.py, analysis/api.py) and the framework-aware
analysis pieces (entry sites in stack hotspots, the training loader, micro-batches), on synthetic
records."""

from __future__ import annotations

import pytest
from test_diagnose import make_facts, make_host, make_loader, make_step

from whyidle.analysis import stacks
from whyidle.analysis.api import training_api
from whyidle.analysis.facts import RunFacts
from whyidle.analysis.run import _train_loader
from whyidle.analysis.transfers import read_summary
from whyidle.diagnose import fixes, rules, rules_batch, rules_gpu, rules_work

LIGHTNING = {"name": "lightning", "label": "Lightning", "version": "2.6.6", "entries": ["Trainer.fit"],
             "entry_sites": ["train.py:80 main"], "also": [],
             "config": {"accumulate_grad_batches": 1, "log_every_n_steps": 50, "precision": "32-true",
                        "progress_bar": {"class": "TQDMProgressBar", "refresh_rate": 1}, "datamodule": "ImageData",
                        "model": "Classifier", "compiled": False, "train_dataloader": "data.py:31 train_dataloader"}}
HF = {"name": "hf_trainer", "label": "Hugging Face Trainer", "version": "5.0", "entries": ["Trainer.train"],
      "entry_sites": ["train.py:60 <module>"], "also": ["accelerate"],
      "config": {"dataloader_num_workers": 0, "dataloader_pin_memory": True, "dataloader_persistent_workers": False,
                 "dataloader_prefetch_factor": None, "logging_steps": 1, "gradient_accumulation_steps": 4,
                 "per_device_train_batch_size": 4, "bf16": False, "fp16": False}}
ACC = {"name": "accelerate", "label": "Accelerate", "version": "1.15", "entries": ["Accelerator.__init__"],
       "entry_sites": [], "also": [], "config": {"mixed_precision": "no", "non_blocking": False}}
TORCH = {"name": "torch", "label": "PyTorch", "version": None, "entries": [], "entry_sites": [], "also": [],
         "config": {}}


def with_api(facts: RunFacts, api: dict, compiled: bool = False) -> RunFacts:
    return facts.replace(api=api, compiled=compiled)


def input_facts(api: dict, **loader):
    loader = dict(make_loader(nw=0, batch=32), sampler="RandomSampler", collate_fn="RemoveColumnsCollator",
                  collate_user=False, created=["train.py:40 main", "train.py:40 main"], **loader)
    facts = make_facts(make_step(data=0.6, fwd=0.15, bwd=0.15, opt=0.05, data_cpu_share=0.95),
                       make_host(cores=4, cpu_busy=0.3), loader)
    return with_api(facts, api)


# -- loader fixes ------------------------------------------------------------------------------------

def test_hf_trainer_gets_training_arguments_never_its_internal_dataloader():
    f = rules.input_bound(input_facts(HF))
    code = f["fix"]["code"]
    assert "TrainingArguments(" in code and "dataloader_num_workers=" in code and "# was 0" in code
    assert "dataloader_persistent_workers=True" in code and "dataloader_prefetch_factor=4" in code
    assert "DataLoader(" not in code and "RemoveColumnsCollator" not in code
    assert "dataloader_pin_memory" not in code  # already True (the default): nothing to advise
    assert "TrainingArguments" in f["fix"]["text"]


def test_lightning_gets_its_train_dataloader_hook():
    f = rules.input_bound(input_facts(LIGHTNING))
    code = f["fix"]["code"]
    assert code.startswith("# ImageData.train_dataloader (data.py:31 train_dataloader)")
    assert "def train_dataloader(self):" in code and "return DataLoader(self.train_set" in code
    assert "RemoveColumnsCollator" not in code and "pin_memory=torch.cuda.is_available())" in code  # no GPU here
    assert "ImageData.train_dataloader" in f["fix"]["text"]
    on_gpu = input_facts(LIGHTNING).replace(device={"kind": "cuda", "name": "NVIDIA H200"})
    assert "pin_memory=True)" in rules.input_bound(on_gpu)["fix"]["code"]


def test_accelerate_gets_its_dataloader_and_prepare():
    gpu = {"kind": "cuda", "name": "NVIDIA H200"}
    code = rules.input_bound(input_facts(ACC).replace(device=gpu))["fix"]["code"]
    assert "loader = DataLoader(dataset" in code and "accelerator.prepare(model, optimizer, loader)" in code
    assert "DataLoaderConfiguration(non_blocking=True)" in code
    done = dict(ACC, config=dict(ACC["config"], non_blocking=True))
    assert "DataLoaderConfiguration" not in rules.input_bound(input_facts(done).replace(device=gpu))["fix"]["code"]
    assert "DataLoaderConfiguration" not in rules.input_bound(input_facts(ACC))["fix"]["code"]  # CPU-only run


def test_plain_torch_loader_names_its_line_and_keeps_a_users_collate():
    facts = input_facts(TORCH)
    code = rules.input_bound(facts)["fix"]["code"]
    assert code.splitlines()[0].endswith("# train.py:40 main") and "collate_fn" not in code  # library collate
    facts.loader.update(collate_fn="pad_batch", collate_user=True)
    assert "collate_fn=pad_batch" in rules.input_bound(facts)["fix"]["code"]
    # the arguments as the program wrote them (recorded at the DataLoader(...) call)
    facts.loader["args"] = {"dataset": "splits['train']", "batch_size": "cfg.bs", "collate_fn": "partial(pad, 0)"}
    first = rules.input_bound(facts)["fix"]["code"].splitlines()[0]
    assert first.startswith("loader = DataLoader(splits['train'], batch_size=cfg.bs, ") and "collate_fn=partial(pad, 0)" in first


def test_no_advice_to_do_what_the_loader_already_does():
    facts = input_facts(TORCH, persistent_workers=True)
    facts.loader.update(num_workers=1, prefetch_factor=8)
    facts.host.update(workers=1, worker_busy_share=0.9)
    f = rules.input_bound(facts)
    assert "keep them alive" not in f["fix"]["text"] and "queue" not in f["fix"]["text"]
    code = f["fix"]["code"]
    assert "persistent_workers=True," in code and "keep workers alive" not in code  # kept, not advised
    assert "prefetch_factor=8," in code and "batches queued" not in code


# -- other fixes -------------------------------------------------------------------------------------

def test_small_batch_per_api():
    facts = make_facts(make_step(batch=4, opt=0.3, fwd=0.2, bwd=0.2), make_host(), make_loader(batch=4))
    assert "per_device_train_batch_size=" in rules_batch.small_batch(with_api(facts, HF))["fix"]["code"]
    # 4 micro-batches of 4: the batch grows to 32 and accumulation stops (32 samples a step, were 16)
    hf = rules_batch.small_batch(with_api(facts, HF))["fix"]["code"]
    assert "gradient_accumulation_steps=1)   # was 4: 32 samples per optimizer step (were 16)" in hf
    eight = with_api(facts, dict(HF, config=dict(HF["config"], gradient_accumulation_steps=16)))
    assert "gradient_accumulation_steps=2)   # was 16: still 64 samples per optimizer step" in \
        rules_batch.small_batch(eight)["fix"]["code"]
    # a plain loop accumulating 8 micro-batches (measured backward calls per step)
    loop = with_api(facts, TORCH).replace(step=dict(facts.step, micro_batches_per_step=8.0))
    assert rules_batch.small_batch(loop)["fix"]["code"].endswith("ACCUM_STEPS = 1   # was 8: still 32 samples per optimizer step")
    assert "def train_dataloader" in rules_batch.small_batch(with_api(facts, LIGHTNING))["fix"]["code"]
    assert rules_batch.small_batch(with_api(facts, TORCH))["fix"]["code"].startswith("loader = DataLoader(")


def test_logging_fix_per_api():
    hot = {"other": [{"function": "train.py log_batch", "site": "train.py:50 log_batch", "code": "log_batch()",
                      "seconds": 1.0, "share": 0.5, "samples": 100, "leaf": "logging/__init__.py:1 emit",
                      "library": False, "framework": False}]}
    facts = make_facts(make_step(fwd=0.2, bwd=0.2, opt=0.05), make_host(), make_loader(), hotspots=hot)
    lt = rules.host_bound(with_api(facts, LIGHTNING))["fix"]
    assert "log_every_n_steps=50" in lt["code"] and "TQDMProgressBar(refresh_rate=50)" in lt["code"]
    assert "on_train_batch_end" in lt["code"] and "self.log" in lt["text"]
    hf = rules.host_bound(with_api(facts, HF))["fix"]
    assert "logging_steps=50" in hf["code"] and "# was 1" in hf["code"] and "on_step_end" in hf["code"]
    acc = rules.host_bound(with_api(facts, ACC))["fix"]["code"]
    assert "accelerator.sync_gradients" in acc


def test_the_logging_guard_never_skips_the_training_on_its_line():
    line = 'x, y = b; loss = F.cross_entropy(self.net(x), y); self.log("loss", loss); return loss'
    _, code = fixes.logging_code(with_api(make_facts(make_step(), make_host(), make_loader()), LIGHTNING), line)
    assert code.splitlines()[1].strip() == 'self.log("loss", loss)'  # only the log call is guarded
    assert "return loss" not in code and "cross_entropy" not in code
    assert fixes.logging_statement('writer.add_scalar("l", loss.item(), step)') == 'writer.add_scalar("l", loss.item(), step)'
    assert fixes.logging_statement("loss = crit(out, y)") == "loss = crit(out, y)"
    assert fixes.logging_statement('print("loss; acc", loss)') == 'print("loss; acc", loss)'  # a ; in a string
    assert fixes.logging_statement('loss = f(x); print("a; b", loss)') == 'print("a; b", loss)'


def test_metric_loop_gets_vectorized_code_and_lightning_torchmetrics():
    focus = {"function": "model.py per_class_acc", "site": "model.py:9 per_class_acc", "code": "for c in range(K):",
             "seconds": 1.0, "share_of_phase": 0.8, "callers": ["training_step"]}
    facts = make_facts(make_step(fwd=0.1, bwd=0.1, opt=0.05), make_host(), make_loader())
    facts.focus = {"other": focus}
    lt = rules.host_bound(with_api(facts, LIGHTNING))
    assert "torchmetrics" in lt["fix"]["code"] and "training_step" in lt["fix"]["text"]
    plain = rules.host_bound(with_api(facts, TORCH))
    assert "torch.bincount" in plain["fix"]["code"] and "training_step" not in plain["fix"]["text"]
    assert "torch.compile" in plain["fix"]["text"]
    assert "torch.compile" not in rules.host_bound(with_api(facts, TORCH, compiled=True))["fix"]["text"]


def test_compiled_model_is_never_told_to_compile():
    facts = make_facts(make_step(fwd=0.45, bwd=0.45, opt=0.05), make_host(), make_loader())
    facts.graph_nodes = 5000
    f = rules.many_small_ops(with_api(facts, TORCH))
    assert f["fix"]["code"] == "model = torch.compile(model)"
    f = rules.many_small_ops(with_api(facts, TORCH, compiled=True))
    assert f["fix"]["code"] is None and "already compiled" in f["fix"]["text"]
    assert "torch.compile" not in rules.device_bound(with_api(facts, TORCH, compiled=True))["fix"]["text"]
    assert "torch_compile=True" in rules.many_small_ops(with_api(facts, HF))["fix"]["code"]


def test_device_bound_leaves_out_mixed_precision_that_is_on():
    facts = make_facts(make_step(fwd=0.45, bwd=0.45, opt=0.05), make_host(), make_loader())
    on = with_api(facts, dict(LIGHTNING, config=dict(LIGHTNING["config"], precision="bf16-mixed")))
    assert "precision" not in rules.device_bound(on)["fix"]["text"]
    assert "precision=\"bf16-mixed\"" in rules.device_bound(with_api(facts, LIGHTNING))["fix"]["text"]
    assert fixes.mixed_precision_on(with_api(facts, dict(HF, config={"bf16": True})))
    assert not fixes.mixed_precision_on(with_api(facts, ACC))


def test_mixed_precision_fix_is_a_framework_setting():
    for api, want in ((LIGHTNING, 'precision="bf16-mixed"'), (HF, "bf16=True"), (ACC, 'mixed_precision="bf16"')):
        text, code = fixes.mixed_precision_code(RunFacts(**{"api": api}), bf16=True)
        assert want in code
    assert fixes.mixed_precision_code(RunFacts(**{"api": TORCH}), bf16=True) is None
    assert "16-mixed" in fixes.mixed_precision_code(RunFacts(**{"api": LIGHTNING}), bf16=False)[1]


def test_host_reads_that_are_python_branches_get_the_vectorize_advice():
    reads = {"steps": 2, "per_step": 12288.5, "micro_batches_per_step": 1,
             "sites": [{"site": "m.py:9 stats", "leaf": "m.py:9 stats", "ops": ["__bool__"], "per_step": 12288.5}]}
    facts = make_facts(make_step(), make_host(), make_loader())
    facts.reads = reads
    f = rules_gpu.sync_bound(with_api(facts, LIGHTNING))
    assert "12,288 times" in f["summary"] or "12,289 times" in f["summary"]
    assert "branching in Python" in f["fix"]["text"] and f["fix"]["code"] is None


def test_hf_loader_without_batch_size_uses_the_measured_one_and_no_pin_advice_on_cpu():
    facts = input_facts(TORCH)
    facts.loader["batch_size"] = None  # built on a batch sampler
    facts.step["batch_size"] = 48.0
    assert "batch_size=48," in rules.input_bound(facts)["fix"]["code"]  # the measured batch
    hf = input_facts(dict(HF, config=dict(HF["config"], dataloader_pin_memory=False)))
    assert "dataloader_pin_memory" not in rules.input_bound(hf)["fix"]["code"]


def test_sync_fix_per_api_and_per_micro_batch():
    reads = {"steps": 2, "per_step": 4.0, "micro_batches_per_step": 4,
             "sites": [{"site": "train.py:12 main", "leaf": "train.py:12 main", "ops": ["item"], "per_step": 4.0}]}
    facts = make_facts(make_step(), make_host(), make_loader())
    facts.reads = reads
    f = rules_gpu.sync_bound(with_api(facts, ACC))
    assert "(1.0 per micro-batch, 4 micro-batches of gradient accumulation per step)" in f["summary"]
    assert f["evidence"]["per_micro_batch"] == 1.0
    assert "accelerator.gather" in f["fix"]["code"]
    assert "self.log" in rules_gpu.sync_bound(with_api(facts, LIGHTNING))["fix"]["code"]


# -- analysis pieces ---------------------------------------------------------------------------------

def test_training_api_ranks_hf_trainer_over_its_accelerator():
    recs = [{"k": "api", "name": "accelerate", "entry": "Accelerator.__init__", "site": "transformers/x.py:1 f",
             "config": {"mixed_precision": "no"}, "version": "1"},
            {"k": "api", "name": "hf_trainer", "entry": "Trainer.train", "site": "train.py:60 <module>",
             "config": {"logging_steps": 5}, "version": "5"},
            {"k": "api", "name": "hf_trainer", "entry": "Trainer.evaluate", "site": "train.py:61 <module>",
             "config": {"logging_steps": 7}, "version": "5"}]
    api = training_api(recs, "torch")
    assert api["name"] == "hf_trainer" and api["also"] == ["accelerate"]
    assert api["config"] == {"logging_steps": 5}  # the training entry's settings
    assert api["entries"] == ["Trainer.train", "Trainer.evaluate"]
    assert api["entry_sites"] == ["train.py:60 <module>", "train.py:61 <module>"]
    assert training_api([], "keras")["name"] == "keras"


def _stacks(sites):
    return [{"k": "stacks", "t": 5, "hz": 100, "n": 1, "mode": "signal", "sites": sites}]


def test_framework_internals_are_one_hotspot_and_never_the_focus():
    recs = _stacks([
        ["other", "train.py:80 main", "lightning/pytorch/loops/x.py:5 run", 30, 300.0, []],
        ["other", "train.py:80 main", "torch/optim/optimizer.py:9 zero_grad", 10, 100.0, []],
        ["other", "model.py:20 per_class_acc", "model.py:20 per_class_acc", 50, 500.0,
         ["model.py:30 training_step", "train.py:80 main"]],
        ["other", "model.py:31 training_step", "torch/nn/functional.py:1 cross_entropy", 10, 100.0,
         ["train.py:80 main"]],
    ])
    entry = frozenset({"train.py:80 main"})
    hot = stacks.hotspots(recs, {"other"}, entry_sites=entry)
    framework = {h["function"]: h for h in hot if h["framework"]}
    assert set(framework) == {"lightning inside train.py:80 main", "torch inside train.py:80 main"}
    assert framework["lightning inside train.py:80 main"]["seconds"] == pytest.approx(0.3)
    assert all(h["library"] for h in framework.values())
    f = stacks.focus(recs, "other", entry_sites=entry)
    assert f["function"] == "model.py per_class_acc" and f["callers"] == ["training_step"]
    # without entry sites the outermost user frame holds everything, yet the innermost candidate wins
    assert stacks.focus(recs, "other")["function"] == "model.py per_class_acc"


def test_training_loader_is_the_one_that_fed_the_steps():
    val = dict(make_loader(batch=64), id=1)
    train = dict(make_loader(batch=32), id=2)
    steps = [{"ld": 2}, {"ld": 2}, {"ld": 1}]
    assert _train_loader([val, train], steps) is train
    assert _train_loader([val, train], [{"ld": None}]) is val  # unknown: the first iterated
    assert _train_loader([], steps) is None


def test_reads_count_optimizer_steps_under_accumulation():
    def rec(step, by, n, mb):
        return {"k": "transfers", "step": step, "by": by, "mb": mb, "items": [],
                "reads": [["t.py:5 main", "t.py:5 main", "item", n]]}
    recs = [rec(0, "loader", 1, 1), rec(1, "loader", 1, 1), rec(2, "loader", 1, 1), rec(3, "optimizer", 1, 1),
            rec(4, "optimizer", 4, 4), rec(5, "optimizer", 4, 4)]
    out = read_summary(recs)
    assert out["per_step"] == 4.0 and out["micro_batches_per_step"] == 4 and out["steps"] == 2
    assert read_summary(recs[:3])["per_step"] == 1.0  # no optimizer step at all: loader steps


def test_mixed_precision_rule_uses_the_framework_setting():
    facts = make_facts(make_step(fwd=0.45, bwd=0.45, opt=0.05), make_host(), make_loader(), gpus=1,
                       devices={"params": {"cuda": 1000}, "param_dtypes": {"float32": 1000}, "autocast": False,
                                "matmul_tf32": True, "cuda_initialized": True})
    facts.device = {"kind": "cuda", "name": "NVIDIA H200", "compute_capability": [9, 0]}
    f = rules_work.no_mixed_precision(with_api(facts, HF))
    assert f is not None and f["fix"]["code"] == "args = TrainingArguments(..., bf16=True)"
    assert "torch.autocast" in rules_work.no_mixed_precision(with_api(facts, TORCH))["fix"]["code"]


def test_lightning_sync_fix_keeps_tensors_and_claims_nothing_about_the_program():
    """The Lightning sync fix shows the pattern (log tensors, keep detached tensors, read them at
    epoch end) without asserting what the program logs today."""
    code = fixes.sync_code(RunFacts(**{"api": {"name": "lightning"}}))
    assert "self.log(" in code and "loss.detach()" in code and "log_every_n_steps=50" in code
    assert "the tensor, not loss.item()" not in code
