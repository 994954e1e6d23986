"""`distill`: task knowledge distillation into a smaller student, in the manner of
DistilBERT (Sanh et al. 2019); the loss, the cached teacher logits and the copying of
teacher layers are compress/techniques/distillation.py (shared with prune's and trim_vocab's recovery).

The teacher is the stage's `from` input (a fine-tuned classifier). The student is, by
default, the teacher's architecture with fewer layers, initialised from the teacher's own
layers (every other one, as DistilBERT did, but aligned to the last layer, which the
fine-tuned head reads; `layers` picks others), with embeddings and classification head
copied. `student` instead names another model (hub id, folder or
`package:MODULE`) that uses the same tokenizer.
"""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveFloat, field_validator, model_validator

from compress.core.architectures import get as get_arch
from compress.techniques.distillation import DistillSettings
from compress.core.registry import ModelSource, StageKind, StageResult


class Config(DistillSettings):
    """Distillation into a smaller student; see TrainSettings for the shared training fields."""

    lr: PositiveFloat = Field(
        2e-4, le=10, description="Peak learning rate of AdamW (a shallow student takes a higher one than fine-tuning)."
    )
    layers: list[NonNegativeInt] | None = Field(
        None,
        description="Teacher layers (0-based) the student keeps, in order, e.g. [0, 2, 4]. "
        "Default: every other layer, ending at the last one (6 layers -> [1, 3, 5]): DistilBERT's "
        "every-other-layer choice, aligned to the layer the fine-tuned head reads.",
    )
    student: str | None = Field(
        None,
        description="A separate student model instead of a copy of the teacher's layers: a hub id, "
        "local folder or `package:MODULE` whose tokenizer equals the teacher's.",
    )
    student_revision: str | None = Field(None, description="Hub revision of `student`.")

    @field_validator("layers")
    @classmethod
    def _layers(cls, v):
        if v is not None:
            if not v:
                raise ValueError("must name at least one layer")
            if len(set(v)) != len(v):
                raise ValueError("a layer appears twice")
        return v

    @model_validator(mode="after")
    def _one_student(self):
        if self.student is not None and self.layers is not None:
            raise ValueError("set either `layers` (a copy of teacher layers) or `student` (another model), not both")
        if self.student_revision is not None and self.student is None:
            raise ValueError("`student_revision` needs `student`")
        return self

    def sources(self) -> dict[str, ModelSource]:
        return {} if self.student is None else {"student": ModelSource(self.student, self.student_revision)}


class Result(StageResult):
    train: dict
    train_examples: int
    teacher_layers: int
    student_layers: int
    initialised_from: list[int] | str  # teacher layers, or the student's source
    params_teacher: int
    params: int
    teacher_cache: dict
    teacher_train_accuracy: float
    teacher_precision: str | None = None  # of the live teacher (hidden-state loss); None without it
    # Why the student has no fewer weights than its teacher (ALBERT's shared layers), else None:
    # the report and the decision show it beside the variant.
    not_smaller: str | None = None


def check_model(cfg: Config, model_config: dict) -> str | None:
    """Validation-time check against the teacher's config.json."""
    n = model_config.get("num_hidden_layers", model_config.get("n_layers"))
    if cfg.layers is not None and isinstance(n, int):
        bad = [i for i in cfg.layers if i >= n]
        if bad:
            return f"layers: teacher has {n} layers (0..{n - 1}); no layer {bad[0]}"
    arch = get_arch(model_config.get("model_type"))
    if cfg.layers is not None and arch is not None and arch.first_layer_special and cfg.layers[0] != 0:
        return (f"layers: {arch.family}'s layer 0 is built differently from the others (no attention "
                f"norm), so a student must start with teacher layer 0, e.g. [0, ...]")
    return None


def run(ctx) -> Result:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compress.techniques.distillation import copy_layers, default_layers, distill_from, not_smaller_reason, teacher_precision
    from compress.core.errors import StageError
    from compress.formats import hf
    from compress.techniques.train import set_seed

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    set_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    teacher = hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code).eval().to(ctx.device)
    n_teacher = teacher.config.num_hidden_layers
    params_teacher = sum(p.numel() for p in teacher.parameters())
    problem = check_model(cfg, teacher.config.to_dict())
    if problem:
        raise StageError(f"{ctx.stage_id}: {problem}")

    if cfg.student is None:
        layers = cfg.layers if cfg.layers is not None else default_layers(n_teacher, teacher.config.model_type)
        student = copy_layers(teacher, layers)
        pairs = list(enumerate(layers))
        origin: list[int] | str = layers
    else:
        from compress.recipe.schema import ModelSpec
        from compress.data.sources import check_model_folder, resolve_model

        source = resolve_model(ModelSpec(source=cfg.student, revision=cfg.student_revision), ctx.recipe.base_dir)
        # The same checks as the recipe's model: no custom code unless the recipe allows it,
        # safetensors named as transformers loads them, weights that match the config.
        check_model_folder(source.path, ctx.recipe.model.trust_remote_code)
        s_tok = AutoTokenizer.from_pretrained(source.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
        if s_tok.get_vocab() != tokenizer.get_vocab():
            raise StageError(
                f"{ctx.stage_id}: student '{cfg.student}' uses another tokenizer than the teacher; "
                f"distillation here needs the same vocabulary"
            )
        student, info = AutoModelForSequenceClassification.from_pretrained(
            source.path, num_labels=ctx.num_labels, ignore_mismatched_sizes=True,
            trust_remote_code=ctx.recipe.model.trust_remote_code, use_safetensors=True, output_loading_info=True,
        )
        student = hf.only_head_initialised(student, info, source.path)
        n_student = student.config.num_hidden_layers
        # Uniform matching: student layer j <-> teacher layer at the same relative depth.
        pairs = [(j, round((j + 1) * n_teacher / n_student) - 1) for j in range(n_student)]
        origin = cfg.student
        if cfg.hidden_weight > 0 and student.config.hidden_size != teacher.config.hidden_size:
            raise StageError(
                f"{ctx.stage_id}: hidden_weight needs equal hidden sizes (student "
                f"{student.config.hidden_size}, teacher {teacher.config.hidden_size}); set hidden_weight: 0"
            )

    student, stats, cache_info, teacher_acc = distill_from(
        ctx, student, teacher, tokenizer, cfg, pairs, description=f"{ctx.stage_id}: distill"
    )
    hf.save(student, tokenizer, ctx.out)
    params = sum(p.numel() for p in student.parameters())
    not_smaller = None
    if params >= params_teacher:
        not_smaller = (not_smaller_reason(teacher.config.model_type, n_teacher, student.config.num_hidden_layers)
                       or f"the student has {params:,} weights, its teacher {params_teacher:,}")
        ctx.log(f"  not smaller than its teacher: {not_smaller}")
    ctx.log(
        f"  student {student.config.num_hidden_layers} layers (from {origin}), {stats.examples} examples in "
        f"{stats.seconds:.0f}s ({stats.examples_per_s:.0f} ex/s)"
    )
    return Result(
        format="hf",
        train=stats.as_dict(),
        train_examples=cache_info["examples"],
        teacher_layers=n_teacher,
        student_layers=student.config.num_hidden_layers,
        initialised_from=origin,
        params_teacher=params_teacher,
        params=params,
        not_smaller=not_smaller,
        notes=[f"not smaller than its teacher: {not_smaller}"] if not_smaller else [],
        teacher_cache=cache_info,
        teacher_train_accuracy=round(teacher_acc, 3),
        teacher_precision=teacher_precision(cfg, ctx.device),
    )


KIND = StageKind(
    name="distill",
    summary="DistilBERT-style distillation into fewer layers (cached teacher logits, KL*T^2 + CE, optional hidden cosine).",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="hf",
    check_model=check_model,
    keeps_architecture=lambda cfg: cfg.student is None,  # another student: another architecture
)
