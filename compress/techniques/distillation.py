"""Task knowledge distillation in the manner of DistilBERT (Sanh et al. 2019), shared by
the stages that train a student towards a teacher: `distill`, and the recovery fine-tunes
of `prune` and `trim_vocab`.

Loss per batch, with student logits s, teacher logits t, temperature T:

    alpha * KL(softmax(t/T) || softmax(s/T)) * T^2  +  (1 - alpha) * CE(s, labels)
    + hidden_weight * mean over matched layers of (1 - cos(h_student, h_teacher))

(the KL term is DistilBERT's: the student's tempered distribution is pulled towards the
teacher's; T^2 keeps its gradient scale independent of T, Hinton et al. 2015).

Teacher logits over the training examples are computed once, cached under the run folder
(keyed by teacher, training data, example count and max_length) and copied into the output as
`teacher_logits.npy`: with `hidden_weight: 0` the teacher costs nothing per epoch, and a
re-run with other student settings reuses them. That one pass runs in bfloat16 where the
hardware has it (`teacher_precision`; the logits are kept in fp32). `augment` adds copies of
the whole training sentences with words masked or swapped (compress/techniques/augment.py) for the
teacher to label: on SST-2 most training rows are short phrases, and a 3-layer student
distilled on them alone fell further behind its teacher on whole sentences than on phrases. Hidden states are too large to cache
(examples x tokens x hidden x layers floats: gigabytes for SST-2), so the cosine loss runs
the teacher forward on every step, which makes training slower by roughly the teacher's
forward time (about +50% for a 6-layer fp32 teacher and a 3-layer student). That pass takes no
gradient, so it runs in bfloat16 where the hardware has it (`teacher_precision`): a 4-layer
MiniLM student then trained at 150 examples/s instead of 120 on a 2-core AVX512-BF16 CPU.

A student made of teacher layers (`copy_layers`, `default_layers`) starts from the teacher's
own weights; where the layers live per family is compress/core/architectures.py.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

from compress.core.architectures import get as get_arch
from compress.techniques.augment import AugmentSpec
from compress.techniques.predict import encode, model_inputs, predict_logits
from compress.techniques.train import TrainSettings, bf16_native, train, unwrap, warn_if_bf16_emulated

if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

    import numpy as np
    import torch

    from compress.data.context import StageContext
    from compress.techniques.predict import Encoded


class DistillSettings(TrainSettings):
    """Training settings plus the distillation loss (distill, and the recovery of prune and trim_vocab)."""

    temperature: PositiveFloat = Field(
        2.0, description="Softmax temperature of the distillation term (DistilBERT: 2.0)."
    )
    alpha: float = Field(
        0.5, ge=0, le=1,
        description="Weight of the distillation term; 1 - alpha weighs cross-entropy on the labels "
        "(task distillation commonly uses about 0.5).",
    )
    hidden_weight: NonNegativeFloat = Field(
        0.0,
        description="Weight of the cosine loss between student and teacher hidden states of matched "
        "layers (DistilBERT: 1.0 on the last layer). Above 0 the teacher runs on every step "
        "(hidden states are too large to cache), so training is slower; a bf16 teacher "
        "(`teacher_precision`) costs less. docs/stages.md (\"What the settings measured\") gives figures.",
    )
    teacher_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Arithmetic of the teacher's forward passes: the one-off pass whose logits are cached, "
        "and, with hidden_weight > 0, the pass on every step that feeds the hidden-state loss (the student "
        "trains in `precision`). `auto`: bf16 where the device computes bfloat16 natively (AVX512-BF16 or "
        "AMX CPUs, Ampere and later GPUs), else fp32. The teacher takes no gradient, so bf16 costs only "
        "rounding of its targets (logits are kept in fp32), at about half the time of an fp32 pass.",
    )
    augment: AugmentSpec = Field(
        default_factory=AugmentSpec,
        description="Augmented copies of the whole sentences among the training examples (words masked or "
        "swapped, spans cut; compress/techniques/augment.py), added to them and labelled by the teacher: a small "
        "student sees sentence-length inputs, not only short phrases.",
    )
    teacher_batch_size: PositiveInt = Field(64, description="Batch size of the one-off teacher pass.")

    @field_validator("train_examples", mode="before")
    @classmethod
    def _train_examples(cls, v):
        # Checked before the union so that a typo reads as one plain error, not one per member.
        if v is None or v == "all" or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
            return v
        raise ValueError(f"must be a positive number of examples or `all`, not {v!r}")
    train_examples: PositiveInt | Literal["all"] | None = Field(
        None,
        description="Examples to distil on. Default: the recipe's training subset "
        "(data.max_train_examples). A number, or `all`, adds further examples of the training split "
        "(never the calibration slice): the teacher labels them once (cached), and new examples help "
        "a small student at least as much as more epochs over the same ones.",
    )
    freeze_embeddings: bool = Field(
        True,
        description="Keep the word-embedding matrix fixed (on by default here: the student starts from "
        "the teacher's fine-tuned embeddings, and a frozen matrix trains faster; see TrainSettings).",
    )


# ---------------------------------------------------------------------------------------
# Teacher logits, the loss, the training run


def teacher_cache_key(teacher_fingerprint: str, train_fingerprint: str, max_length: int, examples: int,
                      augment: AugmentSpec | None = None, precision: str = "fp32") -> str:
    # The training split's fingerprint, its seed and the example count fix which examples
    # (and in which order) the logits belong to; the augmentation fixes the copies after them.
    extra = ""
    if augment is not None and augment.copies:
        extra += "/augment " + augment.model_dump_json()
    if precision != "fp32":  # absent for fp32: caches of earlier runs stay valid
        extra += f"/{precision}"
    h = hashlib.sha256(f"{teacher_fingerprint}/{train_fingerprint}/{max_length}/{examples}{extra}".encode()).hexdigest()
    return f"teacher_logits-{h[:32]}"


def teacher_precision(settings: DistillSettings, device: str) -> str | None:
    """The arithmetic the live teacher runs in (None when the hidden-state loss is off)."""
    if settings.hidden_weight <= 0:
        return None
    return logits_precision(settings, device)


def logits_precision(settings: DistillSettings, device: str) -> str:
    """The arithmetic of the teacher's passes (`teacher_precision`, `auto` by the device)."""
    if settings.teacher_precision == "auto":
        return "bf16" if bf16_native(device) else "fp32"
    return settings.teacher_precision


def training_split(ctx: "StageContext", settings: DistillSettings):
    """The examples to distil on (see DistillSettings.train_examples)."""
    n = settings.train_examples
    if n is None:
        return ctx.data.train
    return ctx.data.train_pool(None if n == "all" else n)


def with_augmented(ctx: "StageContext", split, settings: DistillSettings, mask_token: str | None):
    """`split`, then the augmented copies of its whole sentences (DistillSettings.augment;
    `mask_token` is the tokenizer's, None where it has none). Returns (that split, the
    number of copies)."""
    if not settings.augment.copies:
        return split, 0
    import numpy as np

    from compress.techniques.augment import augment
    from compress.tasks.classification.data import Split

    extra = augment(split, settings.augment, mask_token, ctx.data.sentences)
    joined = Split(split.texts + extra.texts, None if split.pairs is None else split.pairs + extra.pairs,
                   np.concatenate([split.labels, extra.labels]))
    return joined, len(extra)


def cached_teacher_logits(
    ctx: "StageContext", teacher, tokenizer, data: "Encoded", teacher_fingerprint: str, max_length: int,
    batch_size: int = 64, augment: AugmentSpec | None = None, precision: str = "fp32",
) -> tuple["np.ndarray", dict]:
    """Teacher logits [N, C] (fp32) over `data` (rows in `data` order), from the run folder's
    cache when this teacher, training data, augmentation, max_length and precision were seen
    before. Also written to the stage output as teacher_logits.npy. Returns (logits, info for
    the result)."""
    import os
    import time

    import numpy as np
    import torch

    key = teacher_cache_key(teacher_fingerprint, ctx.data.train_fingerprint, max_length, len(data), augment, precision)
    path = ctx.cache_dir(key) / "teacher_logits.npy"
    logits = None
    if path.is_file():
        try:
            logits = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            logits = None
        if logits is not None and logits.shape[0] != len(data):
            logits = None
    reused = logits is not None
    seconds = 0.0
    if logits is None:
        t0 = time.perf_counter()
        with ctx.progress(len(data), "teacher logits") as bar, \
                torch.autocast(torch.device(ctx.device).type, torch.bfloat16, enabled=precision == "bf16"):
            logits = predict_logits(teacher, tokenizer, data, batch_size, ctx.device, on_batch=bar.advance)
        seconds = time.perf_counter() - t0
        import io

        from compress.core.files import write_file

        buf = io.BytesIO()
        np.save(buf, logits)
        # atomic (a reader sees nothing or the whole file), never through a link
        write_file(path, buf.getvalue(), tmp=path.with_name(f".{path.name}.{os.getpid()}.part"))
    np.save(ctx.out / "teacher_logits.npy", logits)
    ctx.log(f"  teacher logits: {'reused from cache' if reused else f'computed in {seconds:.0f}s ({precision})'} ({key})")
    return logits, {"key": key, "reused": reused, "seconds": round(seconds, 2), "examples": int(logits.shape[0]),
                    "precision": precision}


def distill_loss(
    teacher_logits: "torch.Tensor",
    settings: DistillSettings,
    teacher=None,
    layer_pairs: list[tuple[int, int]] = (),
    teacher_bf16: bool = False,
):
    """loss_fn(model, batch) for compress.techniques.train.train.

    teacher_logits: [N, C] float, indexed by batch['idx'].
    teacher, layer_pairs: only for hidden_weight > 0: the teacher module and (student layer,
    teacher layer) pairs, 0-based, compared through their output hidden states [B, T, H].
    teacher_bf16: run that teacher under bfloat16 autocast (see `teacher_precision`).
    """
    import torch
    import torch.nn.functional as F

    T, alpha, beta = settings.temperature, settings.alpha, settings.hidden_weight
    use_hidden = beta > 0 and teacher is not None and len(layer_pairs) > 0

    # The [N, C] logits go to the training device once: indexing a CPU copy with the batch's
    # device indices would copy those back to the host, a GPU sync on every step.
    on_device: dict = {}

    def loss_fn(model, batch: dict) -> torch.Tensor:
        inputs = model_inputs(batch)
        out = model(**inputs, output_hidden_states=use_hidden)
        s = out.logits.float()  # [B, C]; fp32 even under bf16 autocast, for the softmaxes
        if s.device not in on_device:
            on_device[s.device] = teacher_logits.to(s.device, torch.float32)
        t = on_device[s.device][batch["idx"].to(s.device)]  # [B, C]
        kd = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True, reduction="batchmean")
        loss = alpha * kd * (T * T) + (1 - alpha) * F.cross_entropy(s, batch["labels"])
        if use_hidden:
            with torch.no_grad(), torch.autocast(s.device.type, torch.bfloat16, enabled=teacher_bf16):
                t_hidden = teacher(**inputs, output_hidden_states=True).hidden_states
            mask = inputs["attention_mask"].to(s.dtype)  # [B, T]: padding does not count
            cos = 0.0
            for si, ti in layer_pairs:  # hidden_states[0] is the embedding output
                c = F.cosine_similarity(out.hidden_states[si + 1].float(), t_hidden[ti + 1].float(), dim=-1)  # [B, T]
                cos = cos + ((1 - c) * mask).sum() / mask.sum()
            loss = loss + beta * cos / len(layer_pairs)
        return loss

    return loss_fn


def distill_from(ctx: "StageContext", student, teacher, tokenizer, settings: DistillSettings,
                 layer_pairs: list[tuple[int, int]], description: str,
                 student_inputs: "Callable[[Encoded], Encoded] | None" = None, teacher_identity: str | None = None):
    """Trains `student` towards `teacher` (the stage's input) on `training_split`, with the
    teacher's logits from the run cache. `student_inputs` maps the teacher's tokenised
    examples to what the student sees instead (same examples, same order: trim_vocab's
    re-split words). `teacher_identity`: the teacher's fingerprint when it is not the stage's
    input (prune's `teacher`). Returns (the unwrapped student, TrainStats, cache info, the
    teacher's accuracy on those training examples in percent)."""
    import torch

    split, copies = with_augmented(ctx, training_split(ctx, settings), settings, tokenizer.mask_token)
    if copies:
        ctx.log(f"  {copies} augmented copies of whole sentences added to {len(split) - copies} training examples")
    data = encode(tokenizer, split, settings.max_length)
    logits, cache_info = cached_teacher_logits(
        ctx, teacher, tokenizer, data, teacher_identity or ctx.input.identity, settings.max_length, settings.teacher_batch_size,
        settings.augment, logits_precision(settings, ctx.device),
    )
    n_plain = len(split) - copies  # the teacher's accuracy on real examples, not on the copies
    teacher_acc = float((logits[:n_plain].argmax(-1) == split.labels[:n_plain]).mean() * 100)
    live_teacher = teacher if settings.hidden_weight > 0 else None  # only the hidden-state loss runs it
    precision = teacher_precision(settings, ctx.device)
    if precision is not None:
        ctx.log(f"  teacher forward for the hidden-state loss in {precision}")
        if precision == "bf16":
            warn_if_bf16_emulated(ctx, "the teacher's bf16 forward")
    loss_fn = distill_loss(torch.from_numpy(logits), settings, live_teacher, layer_pairs, precision == "bf16")
    student_data = student_inputs(data) if student_inputs is not None else data
    stats = train(ctx, student, tokenizer, student_data, settings, loss_fn, description=description)
    return unwrap(student), stats, cache_info, teacher_acc


# ---------------------------------------------------------------------------------------
# A student made of teacher layers


def layer_list(model):
    """The ModuleList of transformer layers of a classifier's encoder (BERT, RoBERTa,
    DistilBERT and most encoders keep them as `<base>.encoder.layer` or `<base>.transformer.layer`)."""
    base = model.base_model
    for owner in ("encoder", "transformer"):
        layers = getattr(getattr(base, owner, None), "layer", None)
        if layers is not None:
            return layers
    raise ValueError(f"{type(model).__name__}: cannot find the encoder's layer list")


def default_layers(n_teacher: int, model_type: str | None = None) -> list[int]:
    """Every other layer, counted from the last: 6 -> [1, 3, 5], 12 -> [1, 3, ..., 11].

    DistilBERT took [0, 2, ..., 10] of a pretrained teacher. A fine-tuned teacher's head
    reads the last layer's output, and keeping that layer matters: on SST-2 with a MiniLM-L6
    teacher, the untrained 3-layer student [1, 3, 5] agrees with the teacher on ~85% of
    held-out examples, [0, 2, 4] on ~54% (chance level).
    Families whose first layer is built differently (ModernBERT) keep layer 0 first instead.
    """
    layers = list(range(n_teacher - 1, -1, -2))[::-1]
    arch = get_arch(model_type)
    if arch is not None and arch.first_layer_special and layers[0] != 0:
        layers[0] = 0
    return layers


def not_smaller_reason(model_type: str | None, n_teacher: int, n_student: int) -> str | None:
    """Why a copied-layers student is not smaller than its teacher (shared layers), or None."""
    arch = get_arch(model_type)
    if arch is None or not arch.shared_layers:
        return None
    return (f"{arch.family} shares one set of layer weights across its passes: the student runs it "
            f"{n_student} times instead of {n_teacher} (faster), but has as many weights as its teacher")


def copy_layers(teacher, layers: list[int]):
    """A student: the teacher's architecture keeping only `layers` (in that order), with
    those layers' weights, embeddings and head copied from the teacher.

    Where the layers live comes from compress/core/architectures.py (e.g. `bert.encoder.layer.3.`,
    `model.layers.3.`); families with shared layers (ALBERT) have no per-layer weights: the
    student applies the shared layer len(layers) times. Unlisted families fall back to any
    `.layer.N.` key."""
    import copy
    import re

    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = len(layers)  # DistilBERT maps this to n_layers
    if getattr(config, "pruned_heads", None):  # pruning is recorded per layer index
        config.pruned_heads = {i: list(config.pruned_heads[t]) for i, t in enumerate(layers) if t in config.pruned_heads}
    student = AutoModelForSequenceClassification.from_config(config)
    where = {t: i for i, t in enumerate(layers)}
    arch = get_arch(config.model_type)
    if arch is None:
        pattern = re.compile(r"^(.*\.layer\.)(\d+)(\..*)$")
    else:  # "<base prefix>.<layers path>.N." (a path with `*` names no single list)
        prefix = re.escape(f"{teacher.base_model_prefix}.{arch.layers}.")
        pattern = re.compile(rf"^({prefix})(\d+)(\..*)$")
    state = {}
    for key, value in teacher.state_dict().items():
        m = None if arch is not None and arch.shared_layers else pattern.match(key)
        if m is None:
            state[key] = value.clone()
        elif int(m.group(2)) in where:
            state[f"{m.group(1)}{where[int(m.group(2))]}{m.group(3)}"] = value.clone()
    student.load_state_dict(state, strict=True)  # every student weight comes from the teacher
    return student
