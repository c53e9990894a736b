"""C07: tokenization on the fly in the data path (cases.md C07).

Stages: synthetic documents (one epoch of the requested steps, 4,000 at most) of ~230 words
(200-260) drawn Zipf-like from a fixed 5,000-word list (synthetic syllable words, some capitalised /
accented / punctuated, a few ``<num>`` placeholders). A 2-way document classifier: tiny transformer encoder (embedding 5,000 x 64,
2 layers, d=64, 4 heads, FF=128, no dropout, mean-pool over non-pad tokens, 2-way head), AdamW,
batch 32, ``DataLoader(num_workers=0)``, 60 steps; T_c ~50 ms on the 2-core dev box.

The tokenizer is a pure-Python BERT-style WordPiece tokenizer: added-token split (character trie),
per-character text cleaning / CJK padding, regex pre-split, lower-casing + NFD accent stripping,
punctuation split, dictionary lookup, greedy longest-match sub-word splitting of unknown words,
truncation / padding to 128 ids. ~2-2.5 ms per document on the dev box.

- faulty: ``__getitem__`` tokenizes its document on every access (in the main process): ~75 ms
  of tokenization per batch of 32 against ~50 ms of compute.
- fixed:  the corpus is tokenized once up front (outside the training loop) into an int32 array
  with the batch encoder (same ids: ASCII fast path + word cache, what fast tokenizers do;
  ``--check-tokens`` verifies it against the per-sample path) and ``__getitem__`` only indexes it.

Expected diagnosis (faulty): ``input_bound``, cause ``cpu_preprocessing`` (loader in the main
process, CPU-busy, not sleeping); the hot spot inside the data fetch is the tokenizer
(``WordPieceTokenizer.encode`` / ``_clean_text`` / ``_wordpiece``: string ops, regex, unicodedata).
Fix: pre-tokenize and cache, a batched fast tokenizer, or at least spread it over workers.

Expected faulty -> fixed throughput ratio: ~2.5x; assert >= 2x (see README for the measured
spread; both costs are CPU work in one process, so the ratio barely moves with machine load).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import re
import unicodedata

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common import StepMeter, make_parser, seed_everything

MAX_LEN = 128
EMBED_ROWS = 5000

# --------------------------------------------------------------------------- synthetic corpus
CONS = list("bcdfghjklmnprstvwz") + ["ch", "sh", "th", "tr", "st"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
CODAS = ["", "", "", "n", "r", "s", "l", "x"]
ACCENT = {"a": "á", "e": "é", "o": "ö", "u": "ü", "i": "í"}


def make_word_list(n=5000):
    rng = np.random.default_rng(1234)  # fixed word list, independent of --seed
    words, seen = [], set()
    while len(words) < n:
        k = int(rng.integers(2, 7))
        w = "".join(
            CONS[rng.integers(len(CONS))] + VOWELS[rng.integers(len(VOWELS))] + CODAS[rng.integers(len(CODAS))]
            for _ in range(k)
        )
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_documents(words, n, seed):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(words) + 1) ** 0.9
    p /= p.sum()
    docs = []
    for _ in range(n):
        nw = int(rng.integers(200, 261))
        ids = rng.choice(len(words), size=nw, p=p).tolist()
        marks = rng.random(nw).tolist()
        out, cap = [], True
        for w_id, r in zip(ids, marks):
            w = words[w_id]
            if r < 0.02:
                w = "".join(ACCENT.get(c, c) for c in w)
            elif r < 0.03:
                w = "<num>"
            if cap:
                w = w.capitalize()
                cap = False
            if r > 0.93:
                w += "."
                cap = True
            elif r > 0.88:
                w += ","
            elif r > 0.875:
                w = '"' + w + '"'
            out.append(w)
        docs.append(" ".join(out))
    labels = rng.integers(0, 2, size=n).astype(np.int64)
    return docs, labels


# --------------------------------------------------------------------------- tokenizer
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<num>", "<url>"]
ADDED = ["[MASK]", "<num>", "<url>", "[CLS]", "[SEP]"]
PUNCT = list(".,;:!?\"'()-")
PRE_SPLIT = re.compile(r"\w+|[^\w\s]")


def build_vocab(words):
    letters = [chr(c) for c in range(97, 123)]
    sylls = sorted({c + v for c in CONS for v in VOWELS})
    vocab = SPECIALS + PUNCT + words[:2000] + letters + ["##" + c for c in letters] + sylls + ["##" + s for s in sylls]
    vocab = list(dict.fromkeys(vocab))
    assert len(vocab) <= EMBED_ROWS
    return vocab


def _is_whitespace(ch):
    if ch in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(ch) == "Zs"


def _is_control(ch):
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp):
    return 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0xF900 <= cp <= 0xFAFF


class WordPieceTokenizer:
    """A pure-Python BERT-style tokenizer (the slow kind)."""

    def __init__(self, vocab, max_len=MAX_LEN):
        self.vocab = {t: i for i, t in enumerate(vocab)}
        self.unk, self.cls, self.sep, self.pad = (self.vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))
        self.max_len = max_len
        self.trie = {}
        for tok in ADDED:
            node = self.trie
            for ch in tok:
                node = node.setdefault(ch, {})
            node[""] = True

    def _split_added_tokens(self, text):
        """Cut the text around added/special tokens (a character trie walked over the text)."""
        pieces, start, i, n = [], 0, 0, len(text)
        while i < n:
            node, j, match = self.trie, i, -1
            while j < n and text[j] in node:
                node = node[text[j]]
                j += 1
                if "" in node:
                    match = j
            if match > 0:
                if start < i:
                    pieces.append((text[start:i], False))
                pieces.append((text[i:match], True))
                start = i = match
            else:
                i += 1
        if start < n:
            pieces.append((text[start:], False))
        return pieces

    def _clean_text(self, text):
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            out.append(" " if _is_whitespace(ch) else ch)
        return "".join(out)

    def _pad_cjk(self, text):
        out = []
        for ch in text:
            if _is_cjk(ord(ch)):
                out.extend((" ", ch, " "))
            else:
                out.append(ch)
        return "".join(out)

    def _strip_accents(self, tok):
        return "".join(c for c in unicodedata.normalize("NFD", tok) if unicodedata.category(c) != "Mn")

    def _split_punct(self, tok):
        pieces, cur = [], []
        for ch in tok:
            if _is_punctuation(ch):
                if cur:
                    pieces.append("".join(cur))
                    cur = []
                pieces.append(ch)
            else:
                cur.append(ch)
        if cur:
            pieces.append("".join(cur))
        return pieces

    def _wordpiece(self, word):
        if word in self.vocab:
            return [self.vocab[word]]
        chars = list(word)
        if len(chars) > 100:
            return [self.unk]
        ids, start = [], 0
        while start < len(chars):
            end, cur = len(chars), None
            while start < end:
                substr = "".join(chars[start:end])
                if start > 0:
                    substr = "##" + substr
                if substr in self.vocab:
                    cur = self.vocab[substr]
                    break
                end -= 1
            if cur is None:
                return [self.unk]
            ids.append(cur)
            start = end
        return ids

    def _token_ids(self, tok):
        ids = []
        for piece in self._split_punct(self._strip_accents(tok.lower())):
            ids.extend(self._wordpiece(piece))
        return ids

    def _finish(self, ids):
        ids = ids[: self.max_len - 1] + [self.sep]
        return ids + [self.pad] * (self.max_len - len(ids))

    def encode(self, text):
        ids = [self.cls]
        for chunk, special in self._split_added_tokens(text):
            if special:
                ids.append(self.vocab[chunk])
                continue
            chunk = self._pad_cjk(self._clean_text(chunk))
            for tok in PRE_SPLIT.findall(chunk):
                ids.extend(self._token_ids(tok))
        return self._finish(ids)

    # -- the batch encoder used to pre-tokenize the corpus once (same ids as encode()) --
    _SAFE = re.compile(r"[ !-~áéöüí]*\Z")  # printable ASCII + the accented letters of the corpus
    _ADDED_RE = re.compile("(" + "|".join(re.escape(t) for t in sorted(ADDED, key=len, reverse=True)) + ")")

    def encode_batch(self, texts):
        cache = {}
        out = np.empty((len(texts), self.max_len), dtype=np.int32)
        for row, text in enumerate(texts):
            if not self._SAFE.match(text):  # anything exotic: the exact slow path
                out[row] = self.encode(text)
                continue
            ids = [self.cls]
            for k, chunk in enumerate(self._ADDED_RE.split(text)):
                if k % 2:
                    ids.append(self.vocab[chunk])
                    continue
                for tok in PRE_SPLIT.findall(chunk):
                    hit = cache.get(tok)
                    if hit is None:
                        hit = cache[tok] = self._token_ids(tok)
                    ids.extend(hit)
            out[row] = self._finish(ids)
        return out


# --------------------------------------------------------------------------- data + model
class RawTextDataset(Dataset):
    """faulty: tokenizes on every access."""

    def __init__(self, docs, labels, tokenizer):
        self.docs, self.labels, self.tokenizer = docs, labels, tokenizer

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, idx):
        ids = self.tokenizer.encode(self.docs[idx])
        return torch.tensor(ids, dtype=torch.long), int(self.labels[idx])


class PreTokenizedDataset(Dataset):
    """fixed: indexes ids tokenized once up front."""

    def __init__(self, token_ids, labels):
        self.token_ids, self.labels = token_ids, labels

    def __len__(self):
        return len(self.token_ids)

    def __getitem__(self, idx):
        return torch.from_numpy(self.token_ids[idx].astype(np.int64)), int(self.labels[idx])


class TinyEncoder(nn.Module):
    def __init__(self, vocab_rows=EMBED_ROWS, d=64, heads=4, ff=128, layers=2, classes=2):
        super().__init__()
        self.embed = nn.Embedding(vocab_rows, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(MAX_LEN, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        pad = ids.eq(0)
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


def main():
    p = make_parser(__doc__, steps=60)
    p.add_argument("--check-tokens", type=int, default=0, metavar="N", help="verify the batch encoder on N documents")
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    words = make_word_list()
    # one epoch holds the requested steps (no epoch boundary inside the timed loop), 4,000 at most
    docs, labels = make_documents(words, min(4000, 32 * (args.steps + 1)), args.seed)
    tokenizer = WordPieceTokenizer(build_vocab(words))

    token_mismatches = None
    if args.check_tokens:
        fast = tokenizer.encode_batch(docs[: args.check_tokens])
        token_mismatches = sum(int(list(fast[i]) != tokenizer.encode(docs[i])) for i in range(len(fast)))

    if args.variant == "faulty":
        dataset = RawTextDataset(docs, labels, tokenizer)
    else:
        dataset = PreTokenizedDataset(tokenizer.encode_batch(docs), labels)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True, num_workers=0)

    model = TinyEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

    meter = StepMeter()
    meter.start()
    step = 0
    while step < args.steps:
        for ids, y in loader:
            meter.got_batch()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(ids), y)
            loss.backward()
            optimizer.step()
            meter.step_done(ids.shape[0])
            step += 1
            if step >= args.steps:
                break
    extra = {"token_mismatches": token_mismatches} if token_mismatches is not None else {}
    meter.print_result(scenario="c07_tokenize_on_the_fly", variant=args.variant, batch_size=32, **extra)


if __name__ == "__main__":
    main()
