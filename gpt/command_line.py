"""The options every command that trains shares: where it runs (--device) and how its runs go to W&B (--wandb)."""

import argparse

DEVICES = ("auto", "cpu", "cuda")  # auto: CUDA where there is a GPU, else the CPU (gpt/devices.py:resolve_device)
WANDB_MODES = ("offline", "online", "disabled")


def add_shared_options(p: argparse.ArgumentParser, wandb: bool = True) -> None:
    """--device and, for a command that runs stages (their records go to W&B), --wandb."""
    p.add_argument("--device", default="auto", choices=DEVICES, help="where to run (auto: CUDA if there is a GPU)")
    if wandb:
        p.add_argument(
            "--wandb",
            default="offline",
            choices=WANDB_MODES,
            help="Weights & Biases mode of each stage's run (offline needs no account or network)",
        )
