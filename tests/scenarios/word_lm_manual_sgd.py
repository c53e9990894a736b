"""Word-level LSTM language model trained by hand, in the way of pytorch/examples' word_language_model.

The structure of that program (main.py + model.py + data.py), on a synthetic corpus made here:

- data: a ``Dictionary`` / ``Corpus`` pair that turns lines of words into one 1-D LongTensor per
  split (train / valid / test), each line ending in ``<eos>``. The lines are drawn from a fixed
  list of ~2,000 made-up words (syllable combinations) with Zipf-like word frequencies and a
  seeded ``random.Random``; nothing is read from disk or downloaded.
- ``batchify`` cuts each split into ``batch_size`` columns; ``get_batch(source, i)`` slices ``bptt``
  rows (inputs) and the same rows shifted by one (targets, flattened).
- ``RNNModel``: Embedding -> dropout -> 2-layer LSTM -> dropout -> Linear decoder -> log_softmax
  (``--tied`` ties the decoder to the embedding), ``init_hidden``; ``NLLLoss``.
- ``train()``: ``repackage_hidden`` (detach the state between batches), ``model.zero_grad()``,
  forward, ``loss.backward()``, ``clip_grad_norm_``, then the manual SGD update
  ``p.data.add_(p.grad, alpha=-lr)`` on every parameter: no ``torch.optim`` and no DataLoader.
  A progress line every ``--log-interval`` batches (lr, ms/batch, loss, ppl).
- after each epoch, ``evaluate(val_data)`` (``model.eval()`` + ``torch.no_grad()``, batch 10),
  ``torch.save(model, f)`` of the whole model object when the validation loss is the best so far,
  else the learning rate is divided by 4; at the end the best model is reloaded
  (``torch.load(f, weights_only=False)``) and evaluated on the test split.

Sizes: vocabulary ~2,000, emsize = nhid = 128, 2 layers, batch 20, bptt 35 (700 tokens per
batch), 40 training batches per epoch; ``--steps`` (default 80) training batches = 2 epochs.
One thread (``torch.set_num_threads(1)``): ~30-45 ms per batch on the 2-core dev box.

Variants (they differ only in how the running loss is read):

- faulty (the example as written): ``total_loss += loss.item()`` on every batch, printed every
  ``--log-interval`` (alias ``--log-every``) batches (default 20; ``--log-interval 1`` prints
  every batch).
- fixed: ``total_loss += loss.detach()`` (a tensor), read once per progress line.

On a CPU the ``.item()`` costs nothing (nothing to wait for), so the two run at the same speed.
Expected diagnosis (both): ``device_bound`` (the LSTM forward/backward and the decoder hold the
step; the data wait, the time in ``get_batch``, is ~0); the faulty one may also carry a
``sync_bound`` info (one host read per step; on a GPU it would be one sync per step).

Timing: ``meter.got_batch()`` right after ``get_batch`` (data wait = the slicing), ``step_done``
after the parameter update and the progress line. The evaluation and the checkpoint between
epochs are kept out of the steps and of the data wait (``eval_s`` in RESULT) but stay in
``wall_s``; ``samples`` are sequences (``batch_size`` per step), ``tokens_per_s`` is also given.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import math
import random
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import StepMeter, make_parser, seed_everything

BATCHES_PER_EPOCH = 40

###############################################################################
# Data (data.py)
###############################################################################


class Dictionary:
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


def make_word_list(n_words, seed):
    """A fixed list of made-up words: 1-3 syllables from a small syllable set."""
    rng = random.Random(seed)
    onsets = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh", "tr", "st"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    codas = ["", "", "n", "r", "s", "t", "l"]
    words, seen = [], set()
    while len(words) < n_words:
        w = "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_lines(words, n_tokens, seed):
    """Lines of text with Zipf-like word frequencies, ~n_tokens words in all (``<eos>`` included)."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    lines, total = [], 0
    while total < n_tokens:
        n = rng.randint(6, 24)
        lines.append(" ".join(rng.choices(words, weights=weights, k=n)))
        total += n + 1
    return lines


class Corpus:
    def __init__(self, seed, train_tokens, valid_tokens, test_tokens, n_words=2000):
        self.dictionary = Dictionary()
        words = make_word_list(n_words, seed)
        self.train = self.tokenize(make_lines(words, train_tokens, seed + 1))
        self.valid = self.tokenize(make_lines(words, valid_tokens, seed + 2))
        self.test = self.tokenize(make_lines(words, test_tokens, seed + 3))

    def tokenize(self, lines):
        """Tokenizes lines of text (as the example tokenizes a text file)."""
        for line in lines:
            for word in line.split() + ["<eos>"]:
                self.dictionary.add_word(word)
        idss = []
        for line in lines:
            ids = [self.dictionary.word2idx[word] for word in line.split() + ["<eos>"]]
            idss.append(torch.tensor(ids, dtype=torch.int64))
        return torch.cat(idss)


###############################################################################
# Model (model.py)
###############################################################################


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            # "Using the Output Embedding to Improve Language Models" (Press & Wolf 2016)
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


###############################################################################
# Training code (main.py)
###############################################################################

# Starting from sequential data, batchify arranges the dataset into columns: with the alphabet
# and batch size 4, column 1 is a..f, column 2 g..l, and so on. The columns are independent
# sequences for the model (the dependence of 'g' on 'f' is lost), which allows batching.


def batchify(data, bsz):
    nbatch = data.size(0) // bsz  # how many full rows fit
    data = data.narrow(0, 0, nbatch * bsz)  # drop the remainder
    return data.view(bsz, -1).t().contiguous()  # bsz columns


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


class EpochMeter(StepMeter):
    def outside_steps(self):
        """What ran since the last step (evaluation, checkpoint) is neither a step nor data wait."""
        now = time.perf_counter()
        self.outside_s = getattr(self, "outside_s", 0.0) + (now - self.last)
        self.last = now
        self.thread_cpu_last = time.thread_time()


def main():
    p = make_parser(__doc__, steps=80)
    p.add_argument("--model", default="LSTM", choices=("LSTM", "GRU"))
    p.add_argument("--emsize", type=int, default=128)
    p.add_argument("--nhid", type=int, default=128)
    p.add_argument("--nlayers", type=int, default=2)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--batch_size", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--log-interval", "--log-every", dest="log_interval", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)

    eval_batch_size = 10
    corpus = Corpus(
        args.seed,
        train_tokens=BATCHES_PER_EPOCH * args.bptt * args.batch_size + args.batch_size,
        valid_tokens=12 * args.bptt * eval_batch_size,
        test_tokens=6 * args.bptt * eval_batch_size,
    )
    # exactly BATCHES_PER_EPOCH full batches of bptt rows (+1 row for the last targets)
    train_data = batchify(corpus.train[: (BATCHES_PER_EPOCH * args.bptt + 1) * args.batch_size], args.batch_size)
    val_data = batchify(corpus.valid, eval_batch_size)
    test_data = batchify(corpus.test, eval_batch_size)

    ntokens = len(corpus.dictionary)
    model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied)
    criterion = nn.NLLLoss()
    fixed = args.variant == "fixed"

    def get_batch(source, i):
        seq_len = min(args.bptt, len(source) - 1 - i)
        data = source[i : i + seq_len]
        target = source[i + 1 : i + 1 + seq_len].reshape(-1)
        return data, target

    def evaluate(data_source):
        model.eval()  # no dropout
        total_loss = 0.0
        hidden = model.init_hidden(eval_batch_size)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, args.bptt):
                data, targets = get_batch(data_source, i)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    state = {"step": 0, "lr": args.lr}
    meter = EpochMeter()

    def train(epoch):
        model.train()  # dropout on
        total_loss = 0.0
        start_time = time.time()
        hidden = model.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i)
            meter.got_batch()
            # Detach the state from how it was produced, or backprop would go back to the corpus start.
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            # clip_grad_norm_ keeps the RNN's gradients from exploding
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-state["lr"])

            if fixed:
                total_loss += loss.detach()
            else:
                total_loss += loss.item()

            if batch % args.log_interval == 0 and batch > 0:
                cur_loss = float(total_loss) / args.log_interval
                elapsed = time.time() - start_time
                print(
                    "| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | "
                    "loss {:5.2f} | ppl {:8.2f}".format(
                        epoch, batch, len(train_data) // args.bptt, state["lr"],
                        elapsed * 1000 / args.log_interval, cur_loss, math.exp(cur_loss),
                    ),
                    flush=True,
                )
                total_loss = 0.0
                start_time = time.time()
            meter.step_done(data.size(1))
            state["step"] += 1
            if state["step"] >= args.steps:
                break

    best_val_loss = None
    epochs = math.ceil(args.steps / BATCHES_PER_EPOCH)
    save_dir = tempfile.mkdtemp(prefix="word_lm_")
    save_path = os.path.join(save_dir, "model.pt")
    eval_s = 0.0
    meter.start()
    for epoch in range(1, epochs + 1):
        epoch_start_time = time.time()
        train(epoch)
        t_eval = time.perf_counter()
        val_loss = evaluate(val_data)
        print("-" * 89)
        print(
            "| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}".format(
                epoch, time.time() - epoch_start_time, val_loss, math.exp(val_loss)
            )
        )
        print("-" * 89, flush=True)
        # Save the model if the validation loss is the best we've seen so far.
        if best_val_loss is None or val_loss < best_val_loss:
            with open(save_path, "wb") as f:
                torch.save(model, f)
            best_val_loss = val_loss
        else:
            # Anneal the learning rate if no improvement has been seen on the validation set.
            state["lr"] /= 4.0
        eval_s += time.perf_counter() - t_eval
        meter.outside_steps()

    # Load the best saved model (the whole object, hence weights_only=False) and run it on test data.
    with open(save_path, "rb") as f:
        model = torch.load(f, weights_only=False)
    model.rnn.flatten_parameters()
    test_loss = evaluate(test_data)
    print("=" * 89)
    print("| End of training | test loss {:5.2f} | test ppl {:8.2f}".format(test_loss, math.exp(test_loss)))
    print("=" * 89, flush=True)
    os.remove(save_path)
    os.rmdir(save_dir)

    res = meter.result()
    meter.print_result(
        scenario="word_lm_manual_sgd",
        variant=args.variant,
        batch_size=args.batch_size,
        bptt=args.bptt,
        ntokens=ntokens,
        tokens_per_s=round(res["samples_per_s"] * args.bptt, 1),
        epochs=epochs,
        eval_s=round(eval_s, 4),
        best_val_loss=round(best_val_loss, 4),
        test_loss=round(test_loss, 4),
        log_interval=args.log_interval,
    )


if __name__ == "__main__":
    main()
