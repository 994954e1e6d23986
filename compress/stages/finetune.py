"""`finetune`: turns a checkpoint into the task baseline (a sequence-classification model).

Also accepts a classifier, to fine-tune it further. Saves safetensors and the tokenizer,
loadable with `from_pretrained`.
"""

from __future__ import annotations

from compress.core.registry import StageKind, StageResult
from compress.techniques.train import TrainSettings


class Config(TrainSettings):
    """Fine-tuning with cross-entropy; see TrainSettings for the shared fields."""


class Result(StageResult):
    train: dict
    train_examples: int
    num_labels: int
    params: int


def run(ctx) -> Result:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from compress.formats import hf
    from compress.techniques.predict import encode
    from compress.techniques.train import set_seed, train, unwrap

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    set_seed(cfg.seed)  # the new head's initialisation depends on it
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    id2label = ctx.data.id2label  # class names, when the data has them: saved in config.json
    names = {"id2label": id2label, "label2id": {n: i for i, n in id2label.items()}} if id2label else {}
    model, info = AutoModelForSequenceClassification.from_pretrained(
        ctx.input.path,
        num_labels=ctx.num_labels,
        ignore_mismatched_sizes=True,  # a classifier with another label count gets a new head
        trust_remote_code=ctx.recipe.model.trust_remote_code,
        use_safetensors=True,  # never the pickle beside it
        output_loading_info=True,
        **names,
    )
    model = hf.only_head_initialised(model, info, ctx.input.path)
    data = encode(tokenizer, ctx.data.train, cfg.max_length)
    stats = train(ctx, model, tokenizer, data, cfg, description=f"{ctx.stage_id}: fine-tune")
    model = unwrap(model)
    hf.save(model, tokenizer, ctx.out)
    ctx.log(
        f"  trained {stats.examples} examples in {stats.seconds:.0f}s ({stats.examples_per_s:.0f} ex/s, "
        f"padding {stats.padding_waste:.0%})"
    )
    return Result(
        format="hf",
        train=stats.as_dict(),
        train_examples=len(data),
        num_labels=ctx.num_labels,
        params=sum(p.numel() for p in model.parameters()),
    )


KIND = StageKind(
    name="finetune",
    summary="Fine-tune a checkpoint into the task baseline (AdamW, warm-up, length-grouped batches).",
    config=Config,
    result=Result,
    run=run,
    accepts=("checkpoint", "hf"),
    produces="hf",
    keeps_architecture=lambda cfg: True,
    new_head=True,
)
