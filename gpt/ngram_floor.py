"""The speedrun's n-gram floor: the validation loss of an interpolated Kneser-Ney character model.

Counted on growing prefixes of the speedrun's training data and scored on its validation windows (docs/speedrun.md,
"The n-gram floor"), each target predicted from the up-to-(order - 1) characters before it inside its window.

    python -m gpt.ngram_floor                       # the cpu profile's data, windows and target
    python -m gpt.ngram_floor --order 5 --records records/cpu-cpu
    python -m gpt.ngram_floor --out runs/cpu-cpu/speedrun/ngram_floor.json   # also as a record (run_all writes one)

Interpolated Kneser-Ney (Chen and Goodman, 1998), one absolute discount per order, D = n1 / (n1 + 2 n2): the longest
context uses the n-grams' counts, each shorter one the continuation counts, and the unigram is interpolated with the
uniform distribution, so every context gives every character a probability and they sum to 1.
"""

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpt.errors import UserError, exit_on_user_error

ORDER = 5
RECORD_FILE = "ngram_floor.json"  # run_all's record of the counts, beside the speedrun's (gpt/report/speedrun.py)
FIRST_PREFIX = 10_000  # characters; each prefix doubles the one before, the last is the whole training split


@dataclass
class _Level:
    """One order's counts (raw or continuation) of its n-grams, and their contexts' totals and types."""

    keys: np.ndarray  # the n-grams' codes, sorted
    counts: np.ndarray
    contexts: np.ndarray  # the contexts' codes (key // vocab), sorted
    totals: np.ndarray  # sum over the next character of the counts
    types: np.ndarray  # how many distinct next characters have a positive count
    discount: float


def _codes(tokens: np.ndarray, n: int, vocab: int) -> np.ndarray:
    """The code of every n-gram of `tokens` (big-endian base `vocab`: a context's n-grams are contiguous)."""
    codes = np.zeros(len(tokens) - n + 1, dtype=np.int64)
    for j in range(n):
        codes = codes * vocab + tokens[j : len(tokens) - n + 1 + j]
    return codes


def _discount(counts: np.ndarray) -> float:
    n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
    return n1 / (n1 + 2 * n2) if n1 else 0.5


def _level(keys: np.ndarray, counts: np.ndarray, vocab: int) -> _Level:
    contexts, first = np.unique(keys // vocab, return_index=True)
    return _Level(
        keys, counts, contexts, np.add.reduceat(counts, first), np.diff(np.append(first, len(keys))), _discount(counts)
    )


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[sorted_keys == query] for each query, 0 where the key is absent."""
    if not len(sorted_keys):
        return np.zeros(len(queries), dtype=values.dtype)
    at = np.minimum(np.searchsorted(sorted_keys, queries), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == queries, values[at], 0)


class KneserNey:
    """An interpolated Kneser-Ney model of `order` over characters 0..vocab-1, counted on `tokens`."""

    def __init__(self, tokens: np.ndarray, vocab: int, order: int = ORDER):
        tokens = np.asarray(tokens, dtype=np.int64)
        if len(tokens) < order + 1:
            raise UserError(f"a {order}-gram model needs more than {order} training characters, got {len(tokens)}")
        self.vocab, self.order = vocab, order
        raw = [np.unique(_codes(tokens, n, vocab), return_counts=True) for n in range(1, order + 1)]
        # raw[n - 1]: the n-grams and their counts, for an n-gram that is the longest context's
        self.raw = [_level(keys, counts, vocab) for keys, counts in raw]
        # continuation counts of the n-grams: how many distinct (n+1)-grams end with each
        self.cont = [_level(*np.unique(raw[n][0] % vocab**n, return_counts=True), vocab) for n in range(1, order)]

    def probabilities(self, histories: np.ndarray, nexts: np.ndarray) -> np.ndarray:
        """P(next | history) for each row: `histories` [N, k] (k < order characters, the last the nearest), `nexts` [N].

        The longest level is the k + 1-gram's counts; the shorter ones the continuation counts."""
        histories, nexts = np.asarray(histories, dtype=np.int64).reshape(len(nexts), -1), np.asarray(nexts)
        k = histories.shape[1]
        if k >= self.order:
            raise ValueError(f"a history of {k} characters is too long for a {self.order}-gram model")
        unigram = self.cont[0] if self.order > 1 and k > 0 else self.raw[0]
        p = self._interpolate(unigram, np.zeros(len(nexts), dtype=np.int64), nexts, np.full(len(nexts), 1 / self.vocab))
        for m in range(2, k + 2):  # the m-gram: the last m - 1 characters of the history, then the next one
            context = np.zeros(len(nexts), dtype=np.int64)
            for j in range(k - (m - 1), k):
                context = context * self.vocab + histories[:, j]
            level = self.raw[m - 1] if m == k + 1 else self.cont[m - 1]
            p = self._interpolate(level, context, context * self.vocab + nexts, p)
        return p

    def _interpolate(self, level: _Level, context: np.ndarray, key: np.ndarray, lower: np.ndarray) -> np.ndarray:
        """(max(c(hw) - D, 0) + D * types(h) * lower) / total(h); `lower` where the context was never seen."""
        total = _lookup(level.contexts, level.totals, context)
        types = _lookup(level.contexts, level.types, context)
        count = _lookup(level.keys, level.counts, key)
        d = level.discount
        seen = total > 0
        return np.where(seen, (np.maximum(count - d, 0) + d * types * lower) / np.maximum(total, 1), lower)

    def cross_entropy(self, windows: np.ndarray) -> float:
        """Mean -log P in nats over every target of `windows` [W, block + 1].

        Target i (window[i + 1]) is predicted from the up-to-(order - 1) characters before it in the window."""
        block = windows.shape[1] - 1
        nll = 0.0
        for i in range(block):
            k = min(i + 1, self.order - 1)
            p = self.probabilities(windows[:, i + 1 - k : i + 1], windows[:, i + 1])
            nll -= np.log(p).sum()
        return nll / (windows.shape[0] * block)


def validation_windows(data_dir, block_size: int, count: int) -> np.ndarray:
    """The windows gpt/evaluation.py scores a run on, [count, block_size + 1]."""
    from gpt.evaluation import ValidationSet

    val = ValidationSet(data_dir, block_size, count)
    return np.stack([np.concatenate([x.numpy(), y.numpy()[-1:]]) for x, y in (val.windows[int(i)] for i in val.starts)])


def prefix_sizes(total: int, first: int = FIRST_PREFIX) -> list[int]:
    """first, twice it, ... and the whole training split last."""
    sizes = []
    while first < total:
        sizes.append(first)
        first *= 2
    return sizes + [total]


def floor(data_dir, block_size: int, count: int, order: int = ORDER):
    """(training characters, validation cross-entropy) for each prefix of the training split, as each is counted."""
    from gpt.data import load_prepared, token_dtype

    prepared = load_prepared(data_dir)
    train = np.fromfile(prepared.bin_path("train"), dtype=token_dtype(prepared.vocab_size))
    windows = validation_windows(data_dir, block_size, count).astype(np.int64)
    for n in prefix_sizes(len(train)):
        yield n, KneserNey(train[:n], prepared.vocab_size, order).cross_entropy(windows)


def measure(profile: str, target: float | None, order: int = ORDER, progress=lambda n, loss: None) -> dict:
    """The floor's record on the speedrun's task of `profile`: each prefix's loss, and the first at or below `target`.

    `progress(n, loss)` is called as each prefix is counted. run_all writes the record beside the speedrun's records
    (RECORD_FILE), where the report reads it."""
    from gpt.ladder import stage_config
    from gpt.records import environment

    cfg = stage_config("speed_0_baseline", profile, speedrun_task=True)
    prefixes = []
    for n, loss in floor(cfg.data_dir, cfg.block_size, cfg.eval_windows, order):
        progress(n, loss)
        prefixes.append((n, loss))
    reached = next((n for n, loss in prefixes if target is not None and loss <= target), None)
    return {
        "order": order,
        "data_dir": Path(cfg.data_dir).name,
        "windows": cfg.eval_windows,
        "block_size": cfg.block_size,
        "target_loss": target,
        "prefixes": prefixes,
        "reached_at": reached,
        "env": environment(),
    }


@exit_on_user_error
def main(argv=None):
    from gpt.ladder import stage_config
    from gpt.records import speedrun_target, write_record

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu", help="whose time-to-loss data, windows and target (default cpu)")
    parser.add_argument(
        "--records",
        type=Path,
        default=None,
        help="the run directory with speed_0's records (default records/<profile>-cpu)",
    )
    parser.add_argument("--order", type=int, default=ORDER)
    parser.add_argument("--out", type=Path, help="also write the counts as a JSON record there (the report reads it)")
    args = parser.parse_args(argv)
    cfg = stage_config("speed_0_baseline", args.profile, speedrun_task=True)
    records = args.records or Path(__file__).resolve().parents[1] / "records" / f"{args.profile}-cpu"
    target = speedrun_target(records, args.profile)
    print(
        f"{args.order}-gram interpolated Kneser-Ney, {Path(cfg.data_dir).name}'s training split, scored on "
        f"{cfg.eval_windows} validation windows of {cfg.block_size} targets (gpt/evaluation.py's)"
    )
    print(
        f"target: {target:.4f} (speed_0's model, {records})"
        if target is not None
        else f"target: none ({records} has not every speed_0 seed)"
    )
    print("| training characters | validation loss (nats/char) |\n|---|---|")
    record = measure(args.profile, target, args.order, lambda n, loss: print(f"| {n:,} | {loss:.4f} |", flush=True))
    if args.out:
        write_record(args.out, record)
    if target is not None:
        reached = record["reached_at"]
        print(
            f"smallest prefix at or below the target: {reached:,} characters"
            if reached
            else "no prefix reaches the target"
        )


if __name__ == "__main__":
    main()
