"""``startup_bound``: the program's own set-up before its first training step holds the job.

Like the other whole-job findings (:mod:`whyidle.diagnose.rules_job`), ``bound`` is a share of
the command's wall time and ``est_speedup`` a wall-time ratio; ``evidence.part_s`` holds the
set-up's seconds for the verdict. The set-up is :func:`whyidle.analysis.startup.startup_split`'s
``program_s`` (imports and the first step left out) and the fix goes around its ``block``
(:mod:`whyidle.analysis.setup_block`).
"""

from __future__ import annotations

import textwrap

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import finding, fix_option, whole_cores
from whyidle.diagnose.rules_job import part_of, trains, wall_gain
from whyidle.diagnose.types import Finding

TORCH_APIS = ("torch", "lightning", "accelerate", "hf_trainer")


def _pair(names: list[str]) -> tuple[str, str]:
    """``(target, value)`` for saving and loading ``names``: one name as is, several as a tuple."""
    what = ", ".join(names)
    return what, (what if len(names) == 1 else f"({what})")


def cache_code(facts: RunFacts, block: dict | None, hf_dataset: bool) -> str:
    """The set-up's block run once and its results loaded on later launches, in the program's API
    (``torch.save``/``torch.load``; a Hugging Face dataset's ``save_to_disk``/``load_from_disk``;
    ``pickle`` for Keras and TensorFlow), holding the names the rest of the function reads; a
    template when the program's source could not be read."""
    names = (block or {}).get("names") or []
    source = (block or {}).get("source")
    if not names or not source:
        names, source = ["data"], "data = prepare_data()   # the set-up's lines"
    body = textwrap.indent(textwrap.dedent(source), "    ")
    where = f"   # made once by {block['site']}" if block else ""
    target, value = _pair(names)
    defs = (block or {}).get("definitions")
    return (textwrap.dedent(defs) + "\n\n" if defs else "") + _cached(facts, target, value, body, where, hf_dataset,
                                                                     source)


def _cached(facts: RunFacts, target: str, value: str, body: str, where: str, hf_dataset: bool, source: str) -> str:
    if hf_dataset and target == value:
        code = (f'import os, datasets\nCACHE = "prepared_dataset"{where}\nif os.path.exists(CACHE):\n'
                f"    {target} = datasets.load_from_disk(CACHE)\nelse:\n{body}\n    {target}.save_to_disk(CACHE)")
        if ".map(" in source and "batched=True" not in source:
            cores = whole_cores(facts.host) if facts.host else 2
            code += (f"\n# faster still, on the first launch: .map(fn, batched=True) with an fn that takes lists, "
                     f"num_proc={min(4, cores)}")
        return code
    if fixes.api_name(facts) in TORCH_APIS:
        return (f'import os\nCACHE = "prepared.pt"{where}\nif os.path.exists(CACHE):\n'
                f"    {target} = torch.load(CACHE, weights_only=False)   # a file this script wrote\nelse:\n"
                f"{body}\n    torch.save({value}, CACHE)")
    return (f'import os, pickle\nCACHE = "prepared.pkl"{where}\nif os.path.exists(CACHE):\n'
            f'    with open(CACHE, "rb") as f:\n        {target} = pickle.load(f)\nelse:\n{body}\n'
            f'    with open(CACHE, "wb") as f:\n        pickle.dump({value}, f, protocol=pickle.HIGHEST_PROTOCOL)')


def _prepare_text(facts: RunFacts, at: str, seconds: float, hf_dataset: bool) -> str:
    first = f"Prepare the data once and load it on later launches: the set-up{at} runs again at every launch ({seconds:.1f} s). "
    if hf_dataset:
        return first + ("Save the prepared dataset (save_to_disk) and load it (load_from_disk); a dataset loaded from "
                        "files also reuses its cached .map() results.")
    if fixes.api_name(facts) in TORCH_APIS:
        return first + ("Save its results with torch.save and load them, or move the per-sample work into the "
                        "Dataset's __getitem__ so the DataLoader's workers do it beside the training.")
    if not fixes.speaks_tensorflow(facts):  # Keras on torch / JAX
        return first + ("Save its results (pickle, numpy .npy) and load them, or move the per-sample work into a "
                        "keras.utils.PyDataset's __getitem__ run by its workers (workers=N) beside the training.")
    return first + ("Save its results (pickle, numpy .npy) and load them, or move the per-sample work into a tf.data "
                    "pipeline (dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)) that runs beside the training.")


def startup_bound(facts: RunFacts) -> Finding | None:
    """The program's own set-up before the first training step (reading, decoding or tokenizing a
    data set, building the model: ``startup_split``'s ``program_s``, imports and the first step
    left out) holds ``T.STARTUP_WARN_SHARE`` or more of the wall time and at least
    ``T.STARTUP_MIN_S`` seconds.

    Cause (``evidence.cause``): ``model_init`` when most of it builds the model (``est_speedup``
    null: what initializing on the device or on ``meta`` saves depends on the device and on what
    the program loads afterwards), else ``data_preparation``: run its block once and load the
    results (:func:`cache_code`; ``est_speedup`` = wall ÷ (wall − ``T.STARTUP_CACHE_SAVING`` × the
    block's seconds, or the whole set-up's when the block is unknown)). Not for a ``whyidle tune``
    trial (``meta.json`` ``stopped``), which whyidle stopped once its steps were measured.
    """
    part = part_of(facts, "startup")
    split = (part or {}).get("split")
    if not split or not trains(facts) or (facts.meta or {}).get("stopped"):
        return None  # a whyidle tune trial: its length, so the set-up's share, was whyidle's choice
    wall = facts.time["wall_s"]
    prog = split["program_s"]
    share = prog / wall if wall > 0 else 0.0
    if prog < T.STARTUP_MIN_S or share < T.STARTUP_WARN_SHARE:
        return None
    sev = "critical" if share >= T.STARTUP_CRITICAL_SHARE else "warning"
    block = split.get("block")
    top = (split.get("program_sites") or [None])[0]
    imports = split["framework_import_s"] + split["imports_s"]
    summary = (f"The program's own set-up before the first training step took {prog:.1f} s, {share:.0%} of the "
               f"wall time" + (f" ({block['site']})" if block else "") + f"; the start-up in all took "
               f"{part['s']:.1f} s (imports {imports:.1f} s, first step {split['first_step_s']:.1f} s).")
    ev = {"part_s": round(prog, 3), "share_of_wall": round(share, 4), "startup_s": round(part["s"], 3),
          "imports_s": round(imports, 3), "first_step_s": round(split["first_step_s"], 3),
          "model_share": round(split["program_model_share"], 3), "block": block,
          "sites": split.get("program_sites") or []}
    if split["program_model_share"] >= T.STARTUP_MODEL_SHARE:
        ev["cause"] = "model_init"
        at_top = f" ({top['site']})" if top else ""
        text = (f"Build the model where it runs: {split['program_model_share']:.0%} of the set-up initializes it"
                f"{at_top}. Create it on the device (with torch.device(\"cuda\"): model = Net()), or on the meta "
                "device when its weights are loaded afterwards (load_state_dict(state, assign=True); Hugging Face: "
                "from_pretrained(..., low_cpu_mem_usage=True)).")
        code = ("with torch.device(\"meta\"):   # no memory, no random init\n    model = Net()\n"
                "model.load_state_dict(torch.load(path, map_location=\"cuda\"), assign=True)")
        gain, cond = None, "when the weights are loaded after the model is built, or on a GPU"
    else:
        ev["cause"] = "data_preparation"
        hf = any("datasets/" in (s.get("leaf") or "") for s in ev["sites"]) or ".map(" in ((block or {}).get("source") or "")
        cached = block["seconds"] if block and block.get("names") else prog
        text = _prepare_text(facts, f" in {block['site']}" if block else "", cached, hf)
        code = cache_code(facts, block, hf)
        gain, cond = wall_gain(facts, cached * T.STARTUP_CACHE_SAVING), None
    return finding("startup_bound", sev, "Start-up set-up holds the job", summary, ev, gain, text, code,
                   bound=share, options=[fix_option(text, gain, cond, code)] if cond else None,
                   docs=["https://pytorch.org/docs/stable/notes/serialization.html",
                         "https://huggingface.co/docs/datasets/process#map"])
