"""The decisions a run makes on its device, resolved once when it is prepared (gpt/train.py:prepare).

A stage's config says what it asks for; the device decides what runs (precision, attention, loss, compile mode,
backend). Each answer comes from its optimization's module, asked once, so the protocol, the training to a loss and
the record (`choices`) read the same answer.
"""

from dataclasses import dataclass

import torch

from gpt.config import TrainConfig
from gpt.optimizations import parallel
from gpt.optimizations.chunked_loss import implementation_of, loss_how, loss_used
from gpt.optimizations.compilation import compile_choice, serial_scatter_adds, uses_cuda_graphs
from gpt.optimizations.feeding import non_blocking
from gpt.optimizations.fused_attention import attention_how, attention_used
from gpt.optimizations.precision import MixedPrecision, mixed_precision
from gpt.peak_memory import memory_method


@dataclass(frozen=True)
class RunChoices:
    """What runs here for what the config asks, and why where the two differ."""

    amp: MixedPrecision
    compute_dtype: torch.dtype
    fp32_matmuls: str
    compile_mode: str | None
    compile_why: str | None  # why a stage that compiles ran eager here (compile only where it pays), else None
    compile_scatter_adds: str | None  # how a compiled CPU run adds into its embeddings' gradients, else None
    non_blocking: bool
    backend: str | None
    memory_method: str
    loss_impl: str | None
    host_allocator: str | None  # what the C allocator does with freed blocks, where a CPU run changed it
    model: dict  # attention, attention_why, attention_how, loss, loss_why, loss_how: model_choices()

    @property
    def cuda_graphs(self) -> bool:
        """Whether the step replays CUDA graphs (a compiled CUDA run's "reduce-overhead")."""
        return uses_cuda_graphs(self.compile_mode)

    def record(self) -> dict:
        """The record's `choices` (docs/records.md)."""
        return {
            "amp_dtype": str(self.amp.dtype).removeprefix("torch."),
            "amp_why": self.amp.why,
            "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
            "grad_scaler": self.amp.scaler.is_enabled(),
            "fp32_matmuls": self.fp32_matmuls,
            "compile_mode": self.compile_mode,
            "compile_why": self.compile_why,
            "compile_scatter_adds": self.compile_scatter_adds,
            "pinned_memory_non_blocking": self.non_blocking,
            "distributed_backend": self.backend,
            "memory_method": self.memory_method,
            "loss_impl": self.loss_impl,
            "host_allocator": self.host_allocator,
            # what the model computes with where a run for time measured the config's choice slower here, or missing
            **self.model,
        }


def resolve(
    cfg: TrainConfig, device: torch.device, fp32_matmuls: str, host_allocator: str | None, model_config
) -> RunChoices:
    """Every per-device decision of a run, each asked of its module once.

    `fp32_matmuls` and `host_allocator` as the run set them up; `model_config` the model's GPTConfig (its attention and
    loss already decided)."""
    amp = mixed_precision(cfg, device)
    mode, compile_why = compile_choice(cfg, device)
    return RunChoices(
        amp=amp,
        compute_dtype=parallel.compute_dtype(cfg, device, amp.dtype),
        fp32_matmuls=fp32_matmuls,
        compile_mode=mode,
        compile_why=compile_why,
        compile_scatter_adds=serial_scatter_adds(mode, device.type),
        non_blocking=non_blocking(cfg, device),
        backend=parallel.backend(cfg, device),
        memory_method=memory_method(device, mode),
        loss_impl=implementation_of(model_config),
        host_allocator=host_allocator,
        model=model_choices(cfg, device, model_config),
    )


def model_choices(cfg: TrainConfig, device: torch.device, model_config) -> dict:
    """The attention and the loss the model computes with, why where not as asked, and how each was chosen.

    How: "measured", "rule: ..." (under CUDA graphs), None where the config's runs unchosen."""
    return {
        "attention": model_config.attention,
        "attention_why": attention_used(cfg, device.type)[1],
        "attention_how": attention_how(cfg, device.type),
        "loss": model_config.loss,
        "loss_why": loss_used(cfg, device.type, model_config.vocab_size)[1],
        "loss_how": loss_how(cfg, device.type, model_config.vocab_size),
    }
