"""Time the output head + loss, forward and backward, for the full loss and each installed chunked-loss implementation.

The implementations are gpt/optimizations/chunked_loss.py's; the timing is at one shape, and says which one fast_6 and
lean_2 should prefer on this device.

    python -m gpt.bench_loss                                  # GPT-2 124M at 16 x 1024 tokens, bf16
    python -m gpt.bench_loss --rows 32768 --dim 192 --vocab 80 --dtype float32

Each variant runs `--warmup` times, then `--repeats` timed calls of forward + backward, each between two device
synchronisations; the table gives the median and the spread (min - max) in ms, and the peak memory of one
call above what was allocated before it (CUDA). Inputs are random (never zeros), drawn once per variant.
"""

import argparse
import sys

import torch

from gpt.command_line import add_shared_options
from gpt.devices import resolve_device
from gpt.errors import UserError, exit_on_user_error
from gpt.optimizations import chunked_loss


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m gpt.bench_loss", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=16 * 1024, help="tokens per step (batch x block)")
    p.add_argument("--dim", type=int, default=768, help="n_embd")
    p.add_argument("--vocab", type=int, default=50257, help="real vocabulary (padded to a multiple of 64)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["bfloat16", "float16", "float32"],
        help="autocast dtype (float32: no autocast)",
    )
    add_shared_options(p, wandb=False)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    if min(args.rows, args.dim, args.vocab, args.repeats) < 1 or args.warmup < 0:
        raise UserError("--rows, --dim, --vocab and --repeats must be >= 1, --warmup >= 0")
    return args


def variants(device_type: str) -> dict:
    """name -> fn(x, weight, targets, vocab, bias): the full loss, and each chunked implementation that runs here."""
    found = {"full": chunked_loss.full_cross_entropy}
    for name in chunked_loss.IMPLEMENTATIONS:
        if chunked_loss.available(name, device_type):
            found[f"chunked ({name})"] = (
                lambda impl: lambda x, w, t, v, b: chunked_loss.chunked_cross_entropy(x, w, t, v, b, impl=impl)
            )(name)
    return found


def padded(vocab: int) -> int:
    return -(-vocab // 64) * 64  # as fast_4_padded_vocab pads it


def time_variant(fn, args, device: torch.device) -> dict:
    return chunked_loss.time_head_and_loss(
        fn,
        args.rows,
        args.dim,
        args.vocab,
        padded(args.vocab),
        getattr(torch, args.dtype),
        device,
        args.warmup,
        args.repeats,
    )


@exit_on_user_error
def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"head + loss, forward and backward: {args.rows} rows x {args.dim} -> {args.vocab} classes (padded to "
        f"{padded(args.vocab)}), {args.dtype}, on {name}, torch {torch.__version__}; "
        f"median of {args.repeats} after {args.warmup} warm-up calls"
    )
    results = {label: time_variant(fn, args, device) for label, fn in variants(device.type).items()}
    print(f"{'variant':<20}{'median ms':>11}{'min - max ms':>18}{'peak MiB':>10}")
    for label, r in results.items():
        peak = f"{r['peak_mib']:,.0f}" if r["peak_mib"] is not None else ""
        print(f"{label:<20}{r['median_ms']:>11.2f}{r['min_ms']:>9.2f} - {r['max_ms']:<6.2f}{peak:>10}")
    missing = [n for n in chunked_loss.IMPLEMENTATIONS if not chunked_loss.available(n, device.type)]
    if missing:
        print(f"not available here: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
