"""Hugging Face Trainer: tokenizing on the fly in ``__getitem__`` with a main-process loader.

Stages: review-style binary classification. 1,024 synthetic documents of 200-300 words (a fixed
3,000-word list of syllable words, some capitalised / accented / with punctuation, a few
numbers; the label is whether "positive" marker words outnumber "negative" ones), kept as raw
strings. ``ReviewDataset.__getitem__`` tokenizes its document on every access with a
hand-written pure-Python tokenizer (no download): Unicode NFD, accent / control-character
stripping and lower-casing per character, a character-class scan that splits words, punctuation
and digits, a word-piece split of long words into chunks of at most 5 characters and a
polynomial character hash of each piece into a 1,000-id vocabulary, then ``[CLS] ... [SEP]``,
truncation to 64 ids (the whole document is tokenized first, as tokenizers do) and padding:
~1.5-2.5 ms per document on the slow 2-core box, i.e. about one compute step per batch of 32.

Model: ``BertForSequenceClassification(BertConfig(hidden_size=64, num_hidden_layers=2,
num_attention_heads=2, intermediate_size=128, vocab_size=1000, max_position_embeddings=64))``
built from the config (random weights, nothing downloaded). ``transformers.Trainer`` with
``TrainingArguments(use_cpu=True, per_device_train_batch_size=32, max_steps=N, learning_rate=5e-4,
save_strategy="no", logging_steps=10_000, report_to=[], disable_tqdm=True,
dataloader_drop_last=True)``, 60 steps.

- faulty: ``dataloader_num_workers=0`` (the default): the Trainer's process tokenizes each batch,
  then trains on it.
- fixed:  ``dataloader_num_workers=1, dataloader_persistent_workers=True,
  dataloader_prefetch_factor=4``: one worker tokenizes the next batches on the other core (2
  cores on this box: 1 worker is the right number).

Timing: a ``TrainerCallback`` (``on_step_begin`` / ``on_step_end``; the Trainer fetches the batch
before ``on_step_begin``) feeds ``fw_meter.SteadyMeter``; the first 5 steps are left out.

Expected diagnosis (faulty): ``input_bound``, cause ``loader_in_main_process`` /
``cpu_preprocessing``: the hot spot of the data fetch is the tokenizer (``HashTokenizer.encode``
/ ``_normalize`` / ``_hash``) under ``ReviewDataset.__getitem__``, reached from the Trainer's
``get_batch_samples``; the fix should be in Trainer terms (``dataloader_num_workers``,
``dataloader_persistent_workers``; or pre-tokenize with ``datasets.map(batched=True)`` / a fast
tokenizer).

Expected faulty -> fixed throughput ratio: at most 2x on 2 cores (both costs are CPU work); the
tokenizer cost is set about equal to the compute step. Measured: median 1.28x, 1.06-1.97x over 5
quiet repeats, ~1.0x while other jobs load the box (see README); the data-wait share (faulty
~0.47, fixed ~0.10-0.18) is the robust signal.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded; fail fast if anything tries
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import tempfile
import unicodedata

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from common import make_parser
from fw_meter import SteadyMeter

VOCAB = 1000
MAX_LEN = 64
BATCH = 32
PAD, CLS, SEP, UNK = 0, 1, 2, 3
N_SPECIAL = 4

CONS = list("bcdfghjklmnprstvwz") + ["ch", "sh", "th", "st"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
ACCENT = {"a": "á", "e": "é", "o": "ö", "u": "ü", "i": "í"}
PUNCT = [",", ".", "!", "?", ";", ":"]


def make_word_list(n=3000):
    rng = np.random.default_rng(1234)  # fixed word list, independent of --seed
    words, seen = [], set()
    while len(words) < n:
        k = int(rng.integers(1, 5))
        w = "".join(CONS[rng.integers(len(CONS))] + VOWELS[rng.integers(len(VOWELS))] for _ in range(k))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_corpus(n_docs, seed):
    words = make_word_list()
    pos, neg = set(words[20:120:2]), set(words[21:121:2])  # interleaved ranks: balanced labels
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, len(words) + 1)
    probs = (1.0 / ranks) / (1.0 / ranks).sum()  # Zipf-like
    docs, labels = [], []
    for _ in range(n_docs):
        ids = rng.choice(len(words), size=int(rng.integers(200, 301)), p=probs)
        out, score = [], 0
        for j in ids:
            w = words[j]
            score += (w in pos) - (w in neg)
            r = rng.random()
            if r < 0.08:
                w = w.capitalize()
            elif r < 0.12:
                w = "".join(ACCENT.get(ch, ch) for ch in w)
            elif r < 0.14:
                w = str(int(rng.integers(0, 2000)))
            if rng.random() < 0.1:
                w += PUNCT[rng.integers(len(PUNCT))]
            out.append(w)
        docs.append(" ".join(out))
        labels.append(int(score > 0))
    return docs, labels


class HashTokenizer:
    """A small hand-written tokenizer: normalise, split, word-piece, hash into the vocabulary."""

    def __init__(self, vocab_size=VOCAB, max_len=MAX_LEN, piece_len=5):
        self.vocab_size, self.max_len, self.piece_len = vocab_size, max_len, piece_len

    def _normalize(self, text):
        out = []
        for ch in unicodedata.normalize("NFD", text):
            cat = unicodedata.category(ch)
            if cat == "Mn":  # combining accent
                continue
            if cat.startswith("C") and ch not in "\t\n\r":  # control / format characters
                continue
            out.append(" " if ch.isspace() else ch.lower())
        return "".join(out)

    def _split(self, text):
        tokens, cur = [], []
        for ch in text:
            if ch.isalpha():
                cur.append(ch)
                continue
            if cur:
                tokens.append("".join(cur))
                cur = []
            if ch.isdigit():
                tokens.append("<num>" if not tokens or tokens[-1] != "<num>" else None)
                if tokens[-1] is None:
                    tokens.pop()
            elif not ch.isspace():
                tokens.append(ch)
        if cur:
            tokens.append("".join(cur))
        return tokens

    def _hash(self, piece, salt):
        h = salt
        for ch in piece:
            h = (h * 131 + ord(ch)) % 1_000_003
        return N_SPECIAL + h % (self.vocab_size - N_SPECIAL)

    def _pieces(self, word):
        if len(word) <= self.piece_len:
            return [word]
        return [word[i : i + self.piece_len] for i in range(0, len(word), self.piece_len)]

    def encode(self, text):
        ids = [CLS]
        for word in self._split(self._normalize(text)):
            for k, piece in enumerate(self._pieces(word)):
                ids.append(self._hash(piece, 7 if k == 0 else 11))
        ids = ids[: self.max_len - 1] + [SEP]
        mask = [1] * len(ids) + [0] * (self.max_len - len(ids))
        ids = ids + [PAD] * (self.max_len - len(ids))
        return ids, mask


class ReviewDataset(Dataset):
    def __init__(self, docs, labels, tokenizer):
        self.docs, self.labels, self.tokenizer = docs, labels, tokenizer

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        ids, mask = self.tokenizer.encode(self.docs[i])
        return {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.tensor(mask),
            "labels": torch.tensor(self.labels[i]),
        }


class StepTimer(TrainerCallback):
    def __init__(self, meter):
        self.meter = meter

    def on_train_begin(self, args, state, control, **kwargs):
        self.meter.start()

    def on_step_begin(self, args, state, control, **kwargs):
        self.meter.batch_start()

    def on_step_end(self, args, state, control, **kwargs):
        self.meter.batch_end(args.per_device_train_batch_size * args.gradient_accumulation_steps)


def main():
    p = make_parser(__doc__, steps=60)
    args = p.parse_args()
    torch.set_num_threads(1)

    docs, labels = make_corpus(1024, args.seed)
    train_set = ReviewDataset(docs, labels, HashTokenizer())

    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_LEN,
        num_labels=2,
    )
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification(config)

    if args.variant == "faulty":
        loader_args = dict(dataloader_num_workers=0)
    else:
        loader_args = dict(
            dataloader_num_workers=1, dataloader_persistent_workers=True, dataloader_prefetch_factor=4
        )
    meter = SteadyMeter(warmup=5)
    with tempfile.TemporaryDirectory(prefix="hf_trainer_") as out_dir:
        training_args = TrainingArguments(
            output_dir=out_dir,
            use_cpu=True,
            per_device_train_batch_size=BATCH,
            max_steps=args.steps,
            learning_rate=5e-4,
            warmup_steps=10,
            save_strategy="no",
            logging_steps=10_000,
            report_to=[],
            disable_tqdm=True,
            dataloader_drop_last=True,
            seed=args.seed,
            **loader_args,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=train_set, callbacks=[StepTimer(meter)])
        out = trainer.train()
    print(f"train done: global_step {out.global_step}, loss {out.training_loss:.4f}", flush=True)
    meter.print_result(
        scenario="hf_trainer_input",
        variant=args.variant,
        batch_size=BATCH,
        num_workers=training_args.dataloader_num_workers,
    )


if __name__ == "__main__":
    main()
