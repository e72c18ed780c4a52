"""The helpers of the equivalence tests, which check every change that claims to keep the maths against its parent.

Each change is checked on the CPU, beside its home (tests/optimizations/test_<home>.py; the speedrun's systems stage in
tests/test_speedrun.py).

Each test trains a tiny GPT (2 layers, 32 wide, character vocabulary) through the project's own code:
gpt.train.build_model / train_step, gpt.optimizations (the homes), gpt.data.WindowSampler / make_dataset (the
loop is tests/dist_worker.py:run_steps, shared with the torchrun workers). Tolerances are stated per
test: 0 where the same floating-point operations run in the same order, otherwise a bound that float32
reassociation (the same sum added up in another order) or 16-bit rounding explains; the measured
differences are printed (pytest -s).

Gradients are read where AdamW reads them: an optimizer step pre-hook copies every .grad just before
the step (after clipping), since train_step sets them to None once it has stepped.
"""

import torch
from dist_worker import record_grads, run_steps

from gpt import optimizations
from gpt.config import TrainConfig
from gpt.data import WindowSampler, make_dataset
from gpt.optimizations.feeding import make_loader, to_device

CPU = torch.device("cpu")


TINY = dict(
    preset="gpt-mini",
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    dropout=0.0,
    dataset="tokens",
    batch_size=8,
    device="cpu",
    measure_memory=False,
)


NO_CLIP = 1e9  # grad_clip: at this model's gradient norm (~2) a clip coefficient of 1, i.e. no clipping


def tiny_config(data_dir, **overrides) -> TrainConfig:
    return optimizations.validate(TrainConfig(**{**TINY, "data_dir": str(data_dir), **overrides}))


def train_with_grads(cfg: TrainConfig, steps: int, *setups, amp=None):
    grads = []

    def setup(run):
        for s in (record_grads(grads), *setups):
            s(run)

    return run_steps(cfg, steps, setup, amp=amp), grads


def seeded(seed: int):
    """A run_steps setup: reseed the global RNG (dropout's) after build_model seeded the weights."""
    return lambda run: torch.manual_seed(seed)


def max_diff(actual: dict, expected: dict) -> tuple[float, float]:
    """(largest absolute difference, largest difference relative to its tensor's largest magnitude)."""
    assert actual.keys() == expected.keys()
    abs_d = max((actual[k] - expected[k]).abs().max().item() for k in expected)
    rel_d = max(
        ((actual[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-30)).item() for k in expected
    )
    return abs_d, rel_d


def report(what: str, actual: dict, expected: dict, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Print the differences, and how much of assert_close's allowance the worst element uses.

    The allowance: atol + rtol * |expected|, per element."""
    abs_d, rel_d = max_diff(actual, expected)
    line = f"\n{what}: max |diff| {abs_d:.3g}, max |diff| / max |value| {rel_d:.3g}"
    if rtol or atol:
        used = max(((actual[k] - expected[k]).abs() / (atol + rtol * expected[k].abs())).max().item() for k in expected)
        line += f", {used:.2g} of the tolerance"
    print(line)


def global_norm(grads: dict) -> float:
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])).item()


def loader_batches(cfg: TrainConfig, steps: int) -> list:
    dataset = make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size)
    sampler = WindowSampler(len(dataset), cfg.batch_size, steps, cfg.seed)
    loader = make_loader(dataset, sampler, cfg, CPU)
    assert loader.num_workers == cfg.num_workers
    batches = [to_device(b, CPU, cfg) for b in loader]
    del loader  # persistent workers exit with their loader
    return batches


def real_rows(grads: dict, vocab: int) -> dict:
    return {k: (g[:vocab] if k == "transformer.wte.weight" else g) for k, g in grads.items()}


def built_model_config(cfg):
    """The GPTConfig of the model a stage with `cfg` builds on the CPU (vocabulary 65)."""
    from gpt.train import build_model

    return build_model(cfg, 65, CPU)[0].config
