"""Fix code in the program's own API (pure; no framework imports).

A finding's cause is the same whatever drives the loop, but the line a user changes is not: a plain
PyTorch script builds its ``DataLoader``, a Lightning program returns one from
``train_dataloader`` and sets flags on its ``Trainer``, an HF ``Trainer`` program sets
``TrainingArguments``, an Accelerate program configures its ``Accelerator``. Each function here
takes the facts (``facts.api``, :func:`whyidle.analysis.api.training_api`; ``facts.loader``;
``facts.devices``; ``facts.compiled``) and returns the code, or the sentence, for that API.
They never advise what the program already does: options already set are left out or marked as
kept, and a compiled model is never told to compile.
"""

from __future__ import annotations

import ast
import re

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import loader_call
from whyidle.diagnose.loader_call import Change

#: ``prefetch_factor`` the loader fixes suggest (batches queued per worker; PyTorch's default is 2).
PREFETCH = 4

#: Code of the usual fix for per-step host reads: keep the value on the device, read it every N steps.
ACCUMULATE_CODE = ("running_loss += loss.detach()        # stays on the device, no sync\n"
                   "if step % 50 == 0:\n"
                   "    print(running_loss.item() / 50)  # one read per 50 steps\n"
                   "    running_loss.zero_()")

#: Names of a host function that computes metrics (a per-class loop is the usual cost): its fix is a
#: vectorized count, or torchmetrics under Lightning, instead of "log less often".
METRIC_WORDS = {"acc", "accuracy", "metric", "metrics", "confusion", "f1", "precision", "recall", "iou", "auc",
                "per_class", "class"}


def api_name(facts: RunFacts) -> str:
    """``torch``, ``lightning``, ``hf_trainer``, ``accelerate``, ``keras``, ``tensorflow`` or ``none``."""
    api = facts.api or {}
    return api.get("name") or facts.framework or "none"


def keras_backend(facts: RunFacts) -> str | None:
    """The backend a Keras run trained on (``"tensorflow"``, ``"torch"``, ``"jax"``; the ``proc``
    record's, else the ``tf_devices`` one's), None when unknown or not a Keras run."""
    if facts.framework != "keras":
        return None
    return (facts.proc or {}).get("backend") or (facts.tf_devices or {}).get("backend")


def speaks_tensorflow(facts: RunFacts) -> bool:
    """A fix may be written in TensorFlow (``tf.function``, ``tf.data``, ``tf.device``): a
    TensorFlow run, or Keras on the TensorFlow backend (or on one not recorded, as before backends
    were). Never for Keras on torch or JAX, whose program may have no TensorFlow at all."""
    return facts.framework == "tensorflow" or keras_backend(facts) in (None, "tensorflow")


def keras_fit_call(facts: RunFacts) -> dict:
    """The ``keras_call`` record of the last ``fit`` (empty when there is none)."""
    fits = [c for c in facts.keras_calls or [] if c.get("fn") == "fit"]
    return fits[-1] if fits else {}


def keras_host_text(facts: RunFacts, what: str) -> str:
    """The ``host_bound`` fix of a Keras / TensorFlow run for ``what`` (the named work), in the
    backend's terms: ``tf.function`` only where the program has TensorFlow; on torch and JAX,
    ``keras.ops`` inside ``train_step`` and ``steps_per_execution`` for Keras's own per-batch loop."""
    if speaks_tensorflow(facts):
        return (f"Move {what} out of the per-batch path or make it cheaper: vectorize Python loops into whole-"
                "tensor TensorFlow ops, put per-batch tensor work inside the compiled step (a tf.function or "
                "the model's train_step), and read values (.numpy(), float()) only every N batches.")
    return (f"Move {what} out of the per-batch path or make it cheaper: vectorize Python loops into whole-array "
            "keras.ops (or numpy) calls, put per-batch tensor work inside the model's train_step, read values "
            "(float(), .numpy()) only every N batches, and let model.compile(..., steps_per_execution=N) run N "
            f"batches per pass of Keras's own loop (its callbacks and logs once per N); {keras_jit_text(facts)}.")


def keras_jit_text(facts: RunFacts) -> str:
    """How a Keras program compiles its step, by backend: XLA on TensorFlow, ``torch.compile`` on
    torch, ``jax.jit`` (Keras's default there) on JAX."""
    backend = keras_backend(facts)
    if backend == "torch":
        return "a compiled step (model.compile(..., jit_compile=True) runs it through torch.compile)"
    if backend == "jax":
        return "a jit-compiled step (model.compile(..., jit_compile=True), Keras's default on JAX)"
    return "XLA (model.compile(..., jit_compile=True))"


def keras_batch_code(facts: RunFacts, target: int, batch: float) -> str:
    """The ``small_batch`` fix of a Keras / TensorFlow run, where its batches are made: a
    ``tf.data`` batch line only where the program has TensorFlow or fit took a tf.data dataset,
    ``fit(batch_size=)`` for arrays, the batch a ``PyDataset`` or generator returns."""
    kind = keras_fit_call(facts).get("input")
    lines = []
    if kind == "tf.data" or (kind is None and speaks_tensorflow(facts)):
        lines.append(f"ds = ds.batch({target})                     # tf.data: was {batch:g}")
    if kind in ("PyDataset", "generator"):
        lines.append(f"# your {kind}: return batches of {target} samples (was {batch:g})")
    if kind in (None, "numpy", "tensor"):
        lines.append(f"model.fit(x, y, batch_size={target}, ...)   # NumPy arrays: was {batch:g}")
    return "\n".join(lines) or f"# batches of {target} samples (was {batch:g})"


def _config(facts: RunFacts) -> dict:
    return (facts.api or {}).get("config") or {}


def mixed_precision_on(facts: RunFacts) -> bool:
    """Autocast (CUDA or CPU) was seen in a forward, or the framework was told to train in mixed precision
    (Lightning ``precision="bf16-mixed"``, ``TrainingArguments(bf16=True)``, ``Accelerator(mixed_precision=...)``)."""
    if (facts.devices or {}).get("autocast") or (facts.devices or {}).get("autocast_dtypes"):
        return True
    cfg = _config(facts)
    name = api_name(facts)
    if name == "lightning":
        return "mixed" in str(cfg.get("precision") or "") or str(cfg.get("precision") or "").startswith(("bf16", "16"))
    if name == "hf_trainer":
        return bool(cfg.get("bf16") or cfg.get("fp16"))
    if name == "accelerate":
        return str(cfg.get("mixed_precision") or "no") not in ("no", "None")
    return False


def _created(loader: dict) -> str | None:
    """The user's line that built the DataLoader (None when a library built it, or unknown)."""
    user, leaf = (loader.get("created") or [None, None])[:2]
    return user if user and user == leaf else None


def _on_cuda(facts: RunFacts) -> bool:
    return (facts.device or {}).get("kind") == "cuda"


def _batch_size(facts: RunFacts) -> int:
    """The loader's batch size, else the measured samples per batch (a loader built on a batch
    sampler, as the HF Trainer's, has ``batch_size`` None), else 32."""
    size = (facts.loader or {}).get("batch_size") or ((facts.step or {}).get("batch_size"))
    return int(round(size)) if size else 32


def _known_call(facts: RunFacts, lead: str, dataset: str) -> dict:
    """A ``DataLoader(...)`` call made of what the ``loader`` record tells, for a loader whose call
    was not recorded (no source: ``python -c``, a library built it): the program's own argument
    texts where recorded (``args``), its batch size, shuffling, a collate_fn of its own,
    drop_last and the worker settings it has."""
    loader = facts.loader or {}
    texts = loader.get("args") or {}
    pairs = [(None, texts.get("dataset") or dataset),
             ("batch_size", texts.get("batch_size") or str(_batch_size(facts)))]
    if loader.get("sampler") == "RandomSampler":
        pairs.append(("shuffle", "True"))
    collate = loader.get("collate_fn")
    if collate and collate != "default_collate" and loader.get("collate_user") is not False:
        pairs.append(("collate_fn", texts.get("collate_fn") or collate))
    if loader.get("drop_last"):
        pairs.append(("drop_last", "True"))
    nw = loader.get("num_workers") or 0
    if nw:
        pairs.append(("num_workers", str(nw)))
        if loader.get("mp_context") in ("spawn", "forkserver"):  # the program chose it: keep it
            pairs.append(("multiprocessing_context", f'"{loader["mp_context"]}"'))
        if loader.get("persistent_workers"):
            pairs.append(("persistent_workers", "True"))
        if loader.get("prefetch_factor"):
            pairs.append(("prefetch_factor", str(loader["prefetch_factor"])))
    if loader.get("pin_memory"):
        pairs.append(("pin_memory", "True"))
    args = [{"kind": "kw" if name else "pos", "name": name or "dataset", "text": text} for name, text in pairs]
    return {"callee": "DataLoader", "lead": lead, "args": args, "params": ["dataset"]}


def loader_lines(facts: RunFacts, changes: list[Change], site: str | None = None) -> list[str]:
    """The program's ``DataLoader(...)`` statement with ``changes``, as lines of code.

    Built from the call as the program wrote it where it was recorded (the ``loader`` record's
    ``call``: every argument kept, only ``changes`` differ; :func:`whyidle.diagnose.loader_call.rewrite`),
    to paste over it; else from what the record tells (:func:`_known_call`). Under Lightning the
    call is the ``train_dataloader`` hook's: the recorded ``return DataLoader(...)`` statement, or
    the hook written out. ``site``: where the change applies (default: the line that built it).
    """
    loader = facts.loader or {}
    hook = api_name(facts) == "lightning" and _config(facts).get("train_dataloader")
    call = loader.get("call")
    if loader_call.valid(call):
        return loader_call.rewrite(call, changes, site or (loader.get("created") or [None])[0])
    if hook:
        lines = loader_call.rewrite(_known_call(facts, "return ", "self.train_set"), changes)
        return ["def train_dataloader(self):"] + ["    " + line for line in lines]
    return loader_call.rewrite(_known_call(facts, "loader = ", "dataset"), changes, site or _created(loader))


def loader_name(facts: RunFacts) -> str:
    """The name the program gives its training DataLoader (``train_loader``), else ``loader``."""
    call = (facts.loader or {}).get("call")
    return (loader_call.target(call) if loader_call.valid(call) else None) or "loader"


def written(facts: RunFacts, name: str) -> str | None:
    """The source text the program passed for the DataLoader parameter ``name`` (``seed_worker`` for
    ``worker_init_fn=seed_worker``), from its recorded call or ``args``; None when not passed or unknown."""
    loader = facts.loader or {}
    call = loader.get("call")
    if loader_call.valid(call):
        return next((a["text"] for a in call["args"] if a["kind"] in ("pos", "kw") and a.get("name") == name), None)
    text = (loader.get("args") or {}).get(name)
    return text if isinstance(text, str) else None


def collate_code(facts: RunFacts, collate: str) -> str:
    """The program's DataLoader statement with ``collate_fn=collate`` (a function the fix defines above
    it), replacing the program's own collate_fn (marked ``# was ...``), in its API."""
    return "\n".join(in_api(facts, loader_lines(facts, [Change("collate_fn", collate, note="", replace=True)]),
                            tail=False))


def worker_changes(facts: RunFacts, workers: int, prefetch: int = PREFETCH) -> list[Change]:
    """The input-pipeline fix's settings: ``workers`` workers, kept alive across epochs, ``prefetch``
    batches queued per worker (never fewer than the loader queues), and pinned memory (on a CPU-only
    run only asked for when a GPU appears, and never changed where the program sets it)."""
    loader = facts.loader or {}
    nw = loader.get("num_workers") or 0
    changes = [Change("num_workers", str(workers), now=nw)]
    if workers > 0:
        changes.append(Change("persistent_workers", "True", now=bool(loader.get("persistent_workers")),
                              note="keep workers alive between epochs", off="False"))
        pf = loader.get("prefetch_factor")
        changes.append(Change("prefetch_factor", str(max(prefetch, pf or 0)), now=pf, off="None",
                              note="batches queued per worker" if (pf or 2) < prefetch else ""))
    if not loader.get("pin_memory"):  # pinned memory only helps copies to a GPU
        cuda = _on_cuda(facts)
        changes.append(Change("pin_memory", "True" if cuda else "torch.cuda.is_available()", now=False, note="",
                              if_absent=not cuda))
    return changes


def loader_code(facts: RunFacts, workers: int, prefetch: int = PREFETCH) -> str:
    """The input-pipeline fix as code for the program's API.

    Plain PyTorch and Accelerate: the program's ``DataLoader(...)`` statement with the worker
    settings (:func:`worker_changes`, :func:`loader_lines`; Accelerate adds
    ``DataLoaderConfiguration(non_blocking=True)`` when it is off, so pinned batches are copied
    asynchronously by ``prepare``). Lightning: in the ``train_dataloader`` hook (named where the
    program defines it). HF ``Trainer``: the ``TrainingArguments`` fields that change, never the
    ``DataLoader`` (the ``Trainer`` builds it with internal classes). An ``IterableDataset`` gets a
    sharding note.
    """
    loader = facts.loader or {}
    name = api_name(facts)
    cfg = _config(facts)
    nw = loader.get("num_workers") or 0
    if name == "hf_trainer":
        lines = ["args = TrainingArguments(", "    ...,"]
        if workers != nw:
            lines.append(f"    dataloader_num_workers={workers},           # was {nw}")
        if workers > 0 and not cfg.get("dataloader_persistent_workers") and not loader.get("persistent_workers"):
            lines.append("    dataloader_persistent_workers=True,  # keep workers alive between epochs")
        if workers > 0 and (cfg.get("dataloader_prefetch_factor") or loader.get("prefetch_factor") or 2) < prefetch:
            lines.append(f"    dataloader_prefetch_factor={prefetch},        # batches queued per worker")
        if cfg.get("dataloader_pin_memory") is False and _on_cuda(facts):
            lines.append("    dataloader_pin_memory=True,          # was False: pinned batches copy asynchronously")
        lines.append(")")
        return "\n".join(lines)
    code = "\n".join(in_api(facts, loader_lines(facts, worker_changes(facts, workers, prefetch))))
    if loader.get("iterable") and workers > 0:
        code = ("# IterableDataset: every worker runs __iter__; give each a shard, e.g. in __iter__:\n"
                "#   info = torch.utils.data.get_worker_info()\n"
                "#   items = items[info.id::info.num_workers] if info else items\n") + code
    return code


def in_api(facts: RunFacts, lines: list[str], tail: bool = True) -> list[str]:
    """The DataLoader statement in the program's API: under Lightning's ``train_dataloader`` hook
    (named), else followed by what hands the loader on (``trainer.fit``, ``accelerator.prepare``)
    where ``tail``."""
    name = api_name(facts)
    cfg = _config(facts)
    hook = name == "lightning" and cfg.get("train_dataloader")
    if hook:
        owner = cfg.get("datamodule") or cfg.get("model") or "LightningDataModule"
        return [f"# {owner}.train_dataloader ({hook}): Lightning calls it and moves each batch to the device"] + lines
    var = loader_name(facts)
    if tail and name == "lightning":
        lines = lines + [f"trainer.fit(model, train_dataloaders={var})"]
    if tail and name == "accelerate":
        if not cfg.get("non_blocking") and _on_cuda(facts):
            lines = lines + ["accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))"
                             "  # pinned batches copied asynchronously"]
        lines = lines + [f"model, optimizer, {var} = accelerator.prepare(model, optimizer, {var})"]
    return lines


def loader_where(facts: RunFacts) -> str:
    """Where the loader settings live, as a sentence ending (``" in TrainingArguments"``...), or ``""``."""
    name = api_name(facts)
    cfg = _config(facts)
    if name == "hf_trainer":
        return " (TrainingArguments' dataloader_* fields: the Trainer builds the DataLoader)"
    if name == "lightning" and cfg.get("train_dataloader"):
        owner = cfg.get("datamodule") or cfg.get("model")
        return f" (in the DataLoader that {owner + '.' if owner else ''}train_dataloader returns)"
    created = _created(facts.loader or {})
    return f" (the DataLoader built at {created})" if created else ""


def batch_code(facts: RunFacts, target: int, batch: float) -> str:
    """The batch-size change in the program's API. Under gradient accumulation (``k`` micro-batches
    per optimizer step, from the API's setting or the measured backward calls per step) the
    accumulation drops to ``max(1, round(k × batch / target))``, so an optimizer step sees the same
    samples where it can (the training is the same; only the per-micro-batch cost goes); the code
    says when it cannot."""
    name = api_name(facts)
    cfg = _config(facts)
    setting = {"hf_trainer": "gradient_accumulation_steps", "accelerate": "gradient_accumulation_steps",
               "lightning": "accumulate_grad_batches"}.get(name)
    accum = cfg.get(setting) if setting else None
    if not isinstance(accum, int) or accum < 1:
        accum = round((facts.step or {}).get("micro_batches_per_step") or 1) or 1
    fewer = max(1, round(accum * batch / target))
    before, after = accum * batch, fewer * target
    same = ("" if accum <= 1 else f"   # was {accum}: still {before:g} samples per optimizer step" if after == before
            else f"   # was {accum}: {after:g} samples per optimizer step (were {before:g}): scale the learning rate")
    if name == "hf_trainer":
        if accum > 1:
            return (f"args = TrainingArguments(..., per_device_train_batch_size={target},   # was {batch:g}\n"
                    f"                         gradient_accumulation_steps={fewer})" + same)
        return f"args = TrainingArguments(..., per_device_train_batch_size={target})   # was {batch:g}"
    code = "\n".join(in_api(facts, loader_lines(facts, [Change("batch_size", str(target), now=_num(batch))]),
                             tail=False))
    if accum > 1:
        code += "\n" + {"lightning": f"trainer = Trainer(..., accumulate_grad_batches={fewer})",
                        "accelerate": f"accelerator = Accelerator(..., gradient_accumulation_steps={fewer})"
                        }.get(name, f"ACCUM_STEPS = {fewer}") + same
    return code


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x


#: A logging or progress call inside a source line (what the guard in :func:`logging_code` wraps).
LOG_CALL = re.compile(r"\.(log\w*|add_\w+|info|debug|warning|set_postfix\w*|write)\(|\bprint\(|\blogging\.\w+\(")


def logging_statement(line: str) -> str:
    """The logging call(s) of a source line: a one-line step (``x, y = b; loss = f(x, y);
    self.log("loss", loss); return loss``) keeps its other statements out of the guard, which
    would otherwise skip the training itself. The line as it is when every part logs or none does."""
    try:
        tree = ast.parse(line.strip())
    except SyntaxError:  # a line of a longer statement, or `return` outside its function
        try:
            tree = ast.parse("def _():\n " + line.strip()).body[0]
        except SyntaxError:
            return line
    parts = [ast.get_source_segment(line.strip() if isinstance(tree, ast.Module) else "def _():\n " + line.strip(), n)
             for n in tree.body]
    logs = [p for p in parts if p and LOG_CALL.search(p)]
    return "; ".join(logs) if logs and len(logs) < len(parts) else line


def logging_code(facts: RunFacts, call: str) -> tuple[str, str]:
    """``(sentence, code)`` for per-step logging / progress work, in the program's API; ``call``:
    the program's line (only its logging calls go under the guard: :func:`logging_statement`)."""
    name = api_name(facts)
    cfg = _config(facts)
    call = logging_statement(call)
    if name == "lightning" and re.search(r"\b\w+\.log(_dict)?\(", call):  # self.log in a hook: the calls cost
        return ("In Lightning each self.log call costs on every step (validation, reduction, progress bar), "
                "whatever log_every_n_steps says: call it every N batches, or for fewer values.",
                "if batch_idx % 50 == 0:          # batch_idx: training_step's second argument\n"
                f"    {call}")
    if name == "lightning":
        bar = cfg.get("progress_bar") or {}
        lines = [f"trainer = Trainer(..., log_every_n_steps=50)   # was {cfg.get('log_every_n_steps')}",
                 "self.log(\"train_loss\", loss)                 # pass tensors: Lightning reads them when it logs",
                 "",
                 "def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):   # a Callback",
                 "    if batch_idx % 50:                          # was: every batch",
                 "        return",
                 f"    {call}"]
        if bar and (bar.get("refresh_rate") or 0) < 50:
            lines.insert(1, f"trainer = Trainer(callbacks=[TQDMProgressBar(refresh_rate=50)])   # was "
                            f"{bar.get('class')}(refresh_rate={bar.get('refresh_rate')})")
        return ("In Lightning: log with self.log (tensors; Lightning writes them every log_every_n_steps) and return "
                "early from per-batch callback hooks except every N batches.", "\n".join(lines))
    if name == "hf_trainer":
        return ("In the HF Trainer: raise logging_steps, and return early from TrainerCallback.on_step_end except every "
                "N steps.",
                f"args = TrainingArguments(..., logging_steps=50)   # was {cfg.get('logging_steps')}\n\n"
                "class MyCallback(TrainerCallback):\n"
                "    def on_step_end(self, args, state, control, **kwargs):\n"
                "        if state.global_step % 50:        # was: every step\n"
                "            return\n"
                f"        {call}")
    if name == "accelerate":
        return ("", "if accelerator.sync_gradients and step % 50 == 0:   # was: every micro-step\n"
                    f"    {call}                       # accelerator.print(...) prints on the main process only")
    return ("", f"if step % 50 == 0:          # was: every step (step: your training step counter)\n    {call}\n"
                "# tqdm(..., mininterval=1.0) / Lightning: log_every_n_steps=50, TQDMProgressBar(refresh_rate=50)")


def metric_code(facts: RunFacts, name: str) -> str | None:
    """Vectorized code for a per-step metric function (``name`` matches :data:`METRIC_WORDS`), else
    None. Lightning gets torchmetrics (vectorized, accumulated on the device, reduced at epoch end)."""
    words = set(name.lower().replace("-", "_").split("_")) | {name.lower()}
    if not words & METRIC_WORDS:
        return None
    if api_name(facts) == "lightning":
        return ("# __init__: per-class accuracy as a torchmetrics metric (vectorized, kept on the device)\n"
                "self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=K, average=None)\n"
                "# training_step: one vectorized update per batch; computed and logged at epoch end\n"
                "self.train_acc.update(logits.argmax(dim=1), y)")
    return ("# per-class counts in two vectorized calls instead of Python loops over classes and samples\n"
            "correct = torch.bincount(y[pred == y], minlength=num_classes)\n"
            "total = torch.bincount(y, minlength=num_classes)\n"
            "per_class_acc = correct / total.clamp(min=1)     # a tensor: read it (.tolist()) only when you log")


def sync_code(facts: RunFacts) -> str:
    """Keep running values on the device and read them every N steps, in the program's API."""
    name = api_name(facts)
    if name == "lightning":
        return ("# in training_step / callbacks: keep tensors, let Lightning read them when it logs\n"
                "self.log(\"train_loss\", loss)           # a tensor: read once per log_every_n_steps\n"
                "history.append(loss.detach())           # not loss.item(); read all at once in on_train_epoch_end\n"
                "trainer = Trainer(..., log_every_n_steps=50)")
    if name == "accelerate":
        return ("running_loss += loss.detach()          # every micro-batch; stays on the device, no sync\n"
                "micro_batches += 1\n"
                "if accelerator.sync_gradients:         # an optimizer step just ran\n"
                "    opt_step += 1\n"
                "    if opt_step % 50 == 0:             # one read (and one gather) per 50 optimizer steps\n"
                "        avg = accelerator.gather(running_loss).mean().item() / micro_batches\n"
                "        running_loss.zero_(); micro_batches = 0")
    if name == "hf_trainer":
        return ("args = TrainingArguments(..., logging_steps=50)   # the Trainer keeps the loss on the device between logs\n"
                "# in compute_loss / callbacks: keep tensors (loss.detach()) and read them in on_log, not every step")
    return ACCUMULATE_CODE


def mixed_precision_code(facts: RunFacts, bf16: bool) -> tuple[str, str] | None:
    """``(sentence, code)`` turning on mixed precision through the framework, or None for plain PyTorch
    (the caller keeps its autocast code)."""
    name = api_name(facts)
    if name == "lightning":
        flag = "bf16-mixed" if bf16 else "16-mixed"
        return (f"Lightning runs forward and loss under autocast for you with precision=\"{flag}\""
                + ("." if bf16 else " (and scales the loss)."),
                f"trainer = Trainer(..., precision=\"{flag}\")   # was {_config(facts).get('precision')!r}")
    if name == "hf_trainer":
        flag = "bf16" if bf16 else "fp16"
        return (f"The HF Trainer runs autocast (and loss scaling for fp16) for you with {flag}=True.",
                f"args = TrainingArguments(..., {flag}=True)")
    if name == "accelerate":
        flag = "bf16" if bf16 else "fp16"
        return (f"Accelerate wraps forward in autocast for you with mixed_precision=\"{flag}\".",
                f"accelerator = Accelerator(mixed_precision=\"{flag}\")   # accelerator.backward(loss) scales fp16")
    return None


def compile_code(facts: RunFacts) -> str | None:
    """``torch.compile`` in the program's API, or None when the program already compiles its model."""
    if facts.compiled:
        return None
    name = api_name(facts)
    if name == "lightning":
        return "model = torch.compile(model)   # before trainer.fit(model): Lightning trains the compiled module"
    if name == "hf_trainer":
        return "args = TrainingArguments(..., torch_compile=True)"
    if name == "accelerate":
        return "accelerator = Accelerator(dynamo_backend=\"inductor\")   # prepare() compiles the model"
    return "model = torch.compile(model)"


def faster_device_options(facts: RunFacts) -> str:
    """What is left once nothing upstream limits the device: mixed precision (unless on), compile
    (unless compiled), a bigger device, in the program's API."""
    name = api_name(facts)
    opts = []
    if not mixed_precision_on(facts):
        opts.append({"lightning": "Trainer(precision=\"bf16-mixed\") on GPUs with tensor cores",
                     "hf_trainer": "TrainingArguments(bf16=True) on GPUs with tensor cores",
                     "accelerate": "Accelerator(mixed_precision=\"bf16\") on GPUs with tensor cores"}.get(
            name, "mixed precision on GPUs with tensor cores"))
    if not facts.compiled:
        opts.append({"hf_trainer": "TrainingArguments(torch_compile=True)"}.get(name, "torch.compile"))
    opts.append("a bigger device")
    return ", ".join(opts[:-1]) + (" or " if len(opts) > 1 else "") + opts[-1]


def device_code(facts: RunFacts) -> tuple[str, str] | None:
    """``(sentence, code)`` putting model and batches on the GPU through the framework, or None for
    plain PyTorch."""
    name = api_name(facts)
    if name == "lightning":
        return ("Let Lightning place model and batches: ask for the GPU and drop manual .to()/.cpu() calls on the "
                "model.", "trainer = Trainer(..., accelerator=\"gpu\", devices=1)")
    if name == "hf_trainer":
        return ("The HF Trainer moves model and batches to the GPU unless told not to: drop use_cpu=True and any "
                "CUDA_VISIBLE_DEVICES that hides the GPU.", "args = TrainingArguments(..., use_cpu=False)")
    if name == "accelerate":
        return ("Let Accelerate place model and batches: prepare them, and create tensors inside the step on "
                "accelerator.device.",
                "accelerator = Accelerator()                        # cpu=False\n"
                "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
                "mask = torch.ones(n, device=accelerator.device)    # tensors built in the step")
    return None


def pin_code(facts: RunFacts) -> str:
    """Pinned batches copied asynchronously, in the program's API."""
    name = api_name(facts)
    if name == "hf_trainer":
        return "args = TrainingArguments(..., dataloader_pin_memory=True)   # the Trainer copies with non_blocking"
    lines = in_api(facts, loader_lines(facts, [Change("pin_memory", "True", now=False, note="")]), tail=False)
    if name == "lightning":
        return "\n".join(lines + ["# Lightning copies pinned batches with non_blocking=True"])
    if name == "accelerate":
        return "\n".join(lines + ["accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))"])
    return "\n".join(lines + ["x = x.to(device, non_blocking=True)"])


def framework_output_code(facts: RunFacts) -> tuple[str, str]:
    """``(sentence, code)`` when the framework's own progress bar or loggers hold the step: refresh and
    log every N steps through its settings."""
    name = api_name(facts)
    cfg = _config(facts)
    if name == "lightning":
        bar = cfg.get("progress_bar") or {}
        was = f"   # was {bar.get('class')}(refresh_rate={bar.get('refresh_rate')})" if bar else ""
        return ("Refresh Lightning's progress bar and write its logs every N steps, not every step (or turn the bar "
                "off with enable_progress_bar=False when the output goes to a file).",
                "from lightning.pytorch.callbacks import TQDMProgressBar\n"
                f"trainer = Trainer(..., callbacks=[TQDMProgressBar(refresh_rate=50)],{was}\n"
                f"                  log_every_n_steps=50)   # was {cfg.get('log_every_n_steps')}")
    if name == "hf_trainer":
        return ("Log every N steps and turn the Trainer's progress bar off when the output goes to a file.",
                f"args = TrainingArguments(..., logging_steps=50,   # was {cfg.get('logging_steps')}\n"
                "                         disable_tqdm=True)")
    return ("Refresh the progress display and write logs every N steps, not every step.",
            "tqdm(..., mininterval=1.0)   # or: log every 50 steps")
