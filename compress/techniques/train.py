"""The training loop shared by every stage that trains (finetune, distill, prune recovery).

A plain loop in the nanoGPT spirit, on top of library parts: AdamW with linear warm-up
and decay (transformers' scheduler), length-grouped batches (transformers'
LengthGroupedSampler: batches of similar lengths waste little on padding), dynamic padding
(DataCollatorWithPadding) and accelerate, so the same code runs on one CPU or under
`accelerate launch` on several GPUs or machines. Stages differ only in their loss.
Tokenised examples and inference over them are compress/techniques/predict.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from compress.techniques.predict import Encoded, collate, model_inputs
from compress.core.registry import StageConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from compress.data.context import StageContext


class TrainSettings(StageConfig):
    """Settings every training stage shares."""

    epochs: PositiveFloat = Field(1.0, le=1000, description="Passes over the training subset (fractions allowed).")
    lr: PositiveFloat = Field(1e-4, le=10, description="Peak learning rate of AdamW.")
    head_lr: PositiveFloat | None = Field(
        None, le=10, description="Learning rate of the new classification head (defaults to `lr`)."
    )
    batch_size: PositiveInt = Field(32, description="Examples per optimiser step (per process).")
    max_length: PositiveInt = Field(64, description="Tokens kept per example (SST-2: p99 is about 50).")
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="Share of steps with linear warm-up.")
    weight_decay: NonNegativeFloat = Field(0.01, description="AdamW weight decay (not on biases and norms).")
    max_grad_norm: PositiveFloat = Field(1.0, description="Gradient clipping norm.")
    group_by_length: bool = Field(
        True, description="Batch examples of similar length together to cut padding."
    )
    freeze_embeddings: bool = Field(
        False,
        description="Keep the word-embedding matrix fixed. For a small encoder it is half the "
        "parameters (MiniLM-L6: 11.7M of 22.7M), and its dense gradient and AdamW update are a large "
        "share of every step on a CPU: freezing it trains a small student markedly faster.",
    )
    precision: Literal["fp32", "bf16", "auto"] = Field(
        "fp32",
        description="Arithmetic of forward and backward passes. `bf16`: bfloat16 autocast (weights and "
        "optimiser state stay fp32), faster where the hardware computes bfloat16 natively "
        "(CPUs with AVX512-BF16 or AMX, Ampere and later GPUs); elsewhere it is emulated and slower, so "
        "the run warns. `auto`: bf16 where it is native, else fp32, so one recipe suits both kinds of "
        "machine. The teacher's forward pass of a distillation runs under it too.",
    )
    seed: int = Field(0, description="Seed of initialisation, shuffling and dropout.")


# ---------------------------------------------------------------------------------------
# Batches


def padding_waste(lengths: np.ndarray, batches: list[list[int]]) -> float:
    """Share of the padded token grid that is padding."""
    real = sum(int(lengths[b].sum()) for b in batches)
    grid = sum(int(lengths[b].max()) * len(b) for b in batches)
    return 1.0 - real / max(grid, 1)


# ---------------------------------------------------------------------------------------
# Training


@dataclass
class TrainStats:
    steps: int
    examples: int
    seconds: float
    examples_per_s: float
    final_loss: float
    padding_waste: float

    def as_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def warn_if_bf16_emulated(ctx, what: str) -> None:
    """Logs that `what` (something set to bf16) runs emulated, hence slower, on this device."""
    if not bf16_native(ctx.device):
        ctx.log(f"  {what} is emulated on this {ctx.device} (no native bfloat16): expect it slower than fp32")


def resolved_precision(settings: TrainSettings, device: str) -> str:
    """`fp32` or `bf16`: the recipe's `precision`, with `auto` decided by the device."""
    if settings.precision == "auto":
        return "bf16" if bf16_native(device) else "fp32"
    return settings.precision


def bf16_native(device: str) -> bool:
    """Whether `device` computes bfloat16 natively (oneDNN's check on a CPU: AVX512-BF16 or AMX)."""
    import torch

    if device == "cuda":
        # Not torch.cuda.is_bf16_supported(): by default it also answers True where bf16 is
        # only emulated (T4, V100). Native bf16 arithmetic starts with compute capability 8.0.
        return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def set_seed(seed: int) -> None:
    from transformers import set_seed as hf_set_seed

    hf_set_seed(seed)


def _param_groups(model, settings: TrainSettings, head_names: tuple[str, ...]):
    decay, no_decay, head = [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if settings.head_lr is not None and name.startswith(head_names):
            head.append(p)
        elif p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if head:
        groups.append({"params": head, "weight_decay": settings.weight_decay, "lr": settings.head_lr})
    return [g for g in groups if g["params"]]


LossFn = Callable[["torch.nn.Module", dict], "torch.Tensor"]


def ce_loss(model, batch: dict) -> "torch.Tensor":
    return model(**model_inputs(batch), labels=batch["labels"]).loss


def train(
    ctx: "StageContext",
    model,
    tokenizer,
    data: Encoded,
    settings: TrainSettings,
    loss_fn: LossFn = ce_loss,
    description: str = "train",
) -> TrainStats:
    """Trains `model` in place on `data` with `loss_fn(model, batch) -> scalar loss`.

    `batch` holds input_ids/attention_mask/token_type_ids [B, T], labels [B] and idx [B]
    (row numbers into `data`, for per-example extras such as cached teacher logits).
    """
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup
    from transformers.trainer_pt_utils import LengthGroupedSampler

    set_seed(settings.seed)
    # accelerate keeps one device per process, fixed by the first Accelerator: a later one
    # that asks for the CPU raises, and one that asks for the GPU silently stays on the CPU.
    # In a single process whose stages (or tests) ask for another device, start afresh;
    # under a multi-process launch every stage trains where the launch put it.
    state = PartialState() if PartialState._shared_state else None  # None: no Accelerator yet
    if state is not None and state.num_processes == 1 and state.device.type != ctx.device:
        AcceleratorState._reset_state(reset_partial_state=True)
    # mixed_precision="no": the recipe's `precision` decides (bf16 autocast below), not an
    # ACCELERATE_MIXED_PRECISION that `accelerate launch` sets from the user's config.
    accelerator = Accelerator(cpu=ctx.device == "cpu", mixed_precision="no")
    precision = resolved_precision(settings, ctx.device)
    if settings.precision == "bf16":
        warn_if_bf16_emulated(ctx, f"{description}: precision bf16")
    elif settings.precision == "auto":
        ctx.log(f"  {description}: precision auto -> {precision}"
                + ("" if precision == "bf16" else f" (this {ctx.device} has no native bfloat16)"))
    generator = torch.Generator().manual_seed(settings.seed)
    n_epochs = math.ceil(settings.epochs)
    steps_per_epoch = math.ceil(len(data) / settings.batch_size)
    total_steps = max(1, round(settings.epochs * steps_per_epoch))

    if settings.freeze_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)  # [vocab, hidden]; position embeddings still train
    head_names = ("classifier.", "score.", "pre_classifier.")
    optimizer = torch.optim.AdamW(_param_groups(model, settings, head_names), lr=settings.lr)
    scheduler = get_linear_schedule_with_warmup(
        optimizer, round(settings.warmup_ratio * total_steps), total_steps
    )

    def epoch_batches() -> list[list[int]]:
        if settings.group_by_length:
            # Random "megabatches" of 50 batches, each sorted by length, then cut into batches.
            order = list(LengthGroupedSampler(settings.batch_size, lengths=data.lengths.tolist(), generator=generator))
        else:
            order = torch.randperm(len(data), generator=generator).tolist()
        return [order[i : i + settings.batch_size] for i in range(0, len(order), settings.batch_size)]

    all_batches = [b for _ in range(n_epochs) for b in epoch_batches()][:total_steps]
    waste = padding_waste(data.lengths, all_batches)
    loader = DataLoader(data.features, batch_sampler=all_batches, collate_fn=collate(tokenizer))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()

    start = time.perf_counter()
    seen, loss_value, step = 0, float("nan"), 0
    with ctx.progress(total_steps * settings.batch_size, description) as bar:
        for step, batch in enumerate(loader, 1):
            # Autocast here rather than through Accelerator(mixed_precision=...): accelerate keeps
            # that setting process-wide, and stages of one run may differ in precision.
            with torch.autocast(accelerator.device.type, torch.bfloat16, enabled=precision == "bf16"):
                loss = loss_fn(model, batch)  # a distillation teacher's forward pass included
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            n = int(batch["labels"].shape[0]) * accelerator.num_processes
            seen += n
            if step % 10 == 0 or step == len(loader):  # len(loader): this process's share of the steps
                loss_value = float(loss.detach())
                bar.advance(n, loss=f"{loss_value:.3f}")
            else:
                bar.advance(n)
    seconds = time.perf_counter() - start
    model.eval()
    return TrainStats(step, seen, seconds, seen / max(seconds, 1e-9), loss_value, waste)


def unwrap(model):
    """The plain model after accelerate wrapped it (DDP) for saving."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model)
