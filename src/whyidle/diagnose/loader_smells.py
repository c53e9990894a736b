"""DataLoader settings that quietly cost or do nothing (issue 36, part 5; pure): read from the
``loader`` record, reported in ``input_pipeline_config``'s smells whether or not they are today's
bottleneck.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts


def settings(facts: RunFacts) -> list[str]:
    """The smells of the training DataLoader's settings, as sentences:

    - torchdata's ``StatefulDataLoader`` with ``snapshot_every_n_steps=1`` (its default): every
      batch carries a snapshot of the workers' dataset and sampler state, pickled by the worker and
      copied in the training process (meta-pytorch/data #1317: iterations from 10 ms to 2 s);
    - ``persistent_workers=True`` with a dataset that has ``set_epoch``: the workers hold the copies
      of the dataset made when they started, so ``dataset.set_epoch(e)`` in the training process
      reaches none of them (an epoch-seeded shuffle or augmentation stays at its first epoch);
    - ``pin_memory=True`` on a run without a GPU, by a program that never asks for CUDA (one that
      does is meant for a GPU too, where pinning is right: cases.md C21): PyTorch turns it off.
    """
    loader = facts.loader or {}
    nw = loader.get("num_workers") or 0
    smells = []
    if loader.get("snapshot_every_n_steps") == 1:
        smells.append("StatefulDataLoader(snapshot_every_n_steps=1), its default: every batch carries a snapshot of "
                      "the workers' dataset and sampler state, pickled and copied in the training process; set it to "
                      "the checkpoint interval in steps")
    if nw and loader.get("persistent_workers") and loader.get("dataset_set_epoch"):
        smells.append(f"persistent_workers=True and {loader.get('dataset') or 'the dataset'} has set_epoch(): the "
                      "workers keep the copies of the dataset made when they started, so set_epoch called in the "
                      "training process reaches none of them (an epoch-seeded shuffle or augmentation stays at its "
                      "first epoch); pass the epoch through the sampler or a shared value, or re-create the workers")
    params = (facts.devices or {}).get("params") or {}
    asks_cuda = (facts.placement or {}).get("cuda_queries")  # a script meant for a GPU too: pinning is right there
    if loader.get("pin_memory") and (facts.device or {}).get("kind") == "cpu" and "cuda" not in params and not asks_cuda:
        smells.append("pin_memory=True on a run without a GPU: PyTorch turns it off here (nothing to pin for); it "
                      "pins each batch in a thread of the training process once a GPU is there")
    return smells
