"""Which training API drives the run, and its settings (pure: ``api`` records → one dict).

A fix must be written in the API the program uses: a Lightning user changes a ``DataModule`` or the
``Trainer``'s flags, an HF ``Trainer`` user ``TrainingArguments``, an Accelerate user the
``Accelerator``. The ``api`` records (:mod:`whyidle.instrument.frameworks`) say which one ran;
without any, the framework itself (``torch``, ``keras``, ``tensorflow``) is the API.
"""

from __future__ import annotations

from whyidle.analysis.facts import TrainingApi

#: When several framework records are present, the one that drives training: the HF ``Trainer``
#: builds an ``Accelerator`` itself, and a program may import Accelerate beside Lightning.
API_ORDER = ("hf_trainer", "lightning", "accelerate")

#: Names for the report.
LABELS = {"torch": "PyTorch", "lightning": "Lightning", "hf_trainer": "Hugging Face Trainer",
          "accelerate": "Accelerate", "keras": "Keras", "tensorflow": "TensorFlow", "none": "none"}

#: Entry points whose call runs training (their settings are the ones a fix changes).
TRAINING_ENTRIES = ("Trainer.fit", "Trainer.train", "Accelerator.__init__")


def training_api(records: list[dict], framework: str) -> TrainingApi:
    """The training API of one process.

    Args:
        records: the process's records (only ``api`` records are read).
        framework: the process's framework (``torch``, ``keras``, ``tensorflow``, ``none``).
    Returns:
        ``{"name", "label", "version", "config", "entries", "entry_sites", "also"}``: ``name`` one
        of :data:`API_ORDER` or ``framework``; ``config`` the settings recorded at the last
        training entry (``Trainer.fit`` / ``Trainer.train`` / ``Accelerator()``; else the last
        entry) or ``{}``; ``entries`` the entry points called, in order, without repeats;
        ``entry_sites`` the user lines that called them (sorted); ``also`` the other frameworks
        recorded (e.g. ``["accelerate"]`` under the HF ``Trainer``). ``version`` is None without a
        record.
    """
    recs = [r for r in records if r.get("k") == "api" and r.get("name") in API_ORDER]
    if not recs:
        return {"name": framework, "label": LABELS.get(framework, framework), "version": None, "config": {},
                "entries": [], "entry_sites": [], "also": []}
    names = {r["name"] for r in recs}
    name = next(n for n in API_ORDER if n in names)
    own = [r for r in recs if r["name"] == name]
    training = [r for r in own if r.get("entry") in TRAINING_ENTRIES] or own
    entries: list[str] = []
    for r in own:
        if r.get("entry") and r["entry"] not in entries:
            entries.append(r["entry"])
    sites = sorted({r["site"] for r in recs if r.get("site") and r.get("entry") != "Accelerator.__init__"})
    return {"name": name, "label": LABELS[name], "version": training[-1].get("version"),
            "config": training[-1].get("config") or {}, "entries": entries, "entry_sites": sites,
            "also": [n for n in API_ORDER if n in names and n != name]}
