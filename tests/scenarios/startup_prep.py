"""Start-up set-up that holds a short job: the corpus is tokenized again at every launch.

A text classifier (C07's tiny transformer encoder, batch 32) whose script, before training, makes
its documents (standing in for reading a raw corpus) and runs C07's pure-Python WordPiece
tokenizer over every one of them (~2.4 ms a document), as many scripts do at the top of
``train.py``: the job is relaunched often (sweeps, restarts, short fine-tunes), and each launch
pays it again.

- faulty: make and tokenize the corpus at every launch (``--docs`` documents);
- fixed: the tokenized corpus saved once with ``torch.save`` (``--cache``; the first fixed launch
  makes it) and loaded on later launches (whyidle's fix).

With ``--raw-loader`` (a short try of a long job, issue 32): the tokenized corpus is the held-out set,
evaluated once after training (its first 256 documents), and the model trains on other raw documents that its
``DataLoader`` (main process) tokenizes on every access, as C07's faulty variant does: the set-up
holds ~30 % of a 30-step run while the input wait holds about half of every step. Expected:
verdict ``startup_bound`` with ``steady_verdict`` ``input_bound`` (in a longer run the set-up's
seconds stay, the steps' grow).

Expected diagnosis (faulty): ``startup_bound`` (cause ``data_preparation``, the program line
``ids, labels = tokenize_corpus(...)``); fixed: none. The RESULT line's ``wall_s`` is the training
loop only (the same in both); ``setup_s`` is the set-up before it and the process ratio is the one
that moves. Ratios: tests/scenarios/README.md.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tempfile
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from c07_tokenize_on_the_fly import (MAX_LEN, RawTextDataset, TinyEncoder, WordPieceTokenizer, build_vocab,
                                     make_documents, make_word_list)
from common import StepMeter, make_parser, seed_everything


def tokenize_corpus(n_docs: int, seed: int):
    """Reads (here: makes) the corpus and tokenizes every document: the set-up every launch repeats."""
    words = make_word_list()
    docs, labels = make_documents(words, n_docs, seed)
    tokenizer = WordPieceTokenizer(build_vocab(words))
    ids = torch.tensor([tokenizer.encode(d) for d in docs], dtype=torch.long)
    return ids, torch.from_numpy(labels)


def main():
    p = make_parser(__doc__, steps=30)
    p.add_argument("--docs", type=int, default=500, help="documents in the corpus")
    p.add_argument("--cache", default=None, help="the fixed variant's saved corpus (default: in the temp folder)")
    p.add_argument("--raw-loader", action="store_true",
                   help="the tokenized corpus is the held-out set; training documents are tokenized by the "
                        "DataLoader on every access (an input-bound step)")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    t0 = time.perf_counter()
    if args.variant == "faulty":
        ids, labels = tokenize_corpus(args.docs, args.seed)
    else:
        cache = args.cache or os.path.join(tempfile.gettempdir(), f"whyidle-startup-prep-{args.docs}-{args.seed}.pt")
        if os.path.exists(cache):
            ids, labels = torch.load(cache)
        else:
            ids, labels = tokenize_corpus(args.docs, args.seed)
            torch.save((ids, labels), cache)
    setup_s = time.perf_counter() - t0
    assert ids.shape[1] == MAX_LEN
    if args.raw_loader:  # one epoch of raw documents holds the steps; tokenized on every access
        words = make_word_list()
        docs, train_labels = make_documents(words, 32 * (args.steps + 1), args.seed + 1)
        train = RawTextDataset(docs, train_labels, WordPieceTokenizer(build_vocab(words)))
    else:
        train = TensorDataset(ids, labels)
    loader = DataLoader(train, batch_size=32, shuffle=True, drop_last=True)
    model = TinyEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for x, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            meter.step_done(x.shape[0])
            step += 1
            if step >= args.steps:
                break
    extra = {}
    if args.raw_loader:  # the held-out set, evaluated once on its first 256 documents
        n_val = min(256, len(ids))
        model.eval()
        with torch.no_grad():
            hits = sum(int((model(ids[i:i + 64]).argmax(1) == labels[i:i + 64]).sum()) for i in range(0, n_val, 64))
        model.train()
        extra["val_accuracy"] = round(hits / n_val, 4)
    meter.print_result(scenario="startup_prep", variant=args.variant, batch_size=32, setup_s=round(setup_s, 3), **extra)


if __name__ == "__main__":
    main()
