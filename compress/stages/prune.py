"""`prune`: structured pruning of attention heads and FFN neurons, removed physically.

Importance (`importance`):
- `gradient`: Michel et al. 2019, "Are Sixteen Heads Really Better than One?": a mask of
  ones multiplies every head's output (and every FFN neuron's activation); the importance
  of a head or neuron is |d loss / d mask| summed over `importance_examples` training
  examples (cross-entropy on the labels, dropout off). This is the first-order estimate of
  the loss change when the unit is removed.
- `magnitude`: the L2 norm of the unit's weights (a head's query/key/value rows and
  output-projection columns; a neuron's input row and output column). No data needed.

Heads: `heads` is the fraction removed, ranked over all layers (`scope: global`, with
each layer's scores divided by their L2 norm first, as Michel et al. do, so that layers
with large gradients do not lose nothing) or within each layer (`scope: per_layer`). A
layer always keeps at least one head. Removal goes through transformers' `prune_heads`,
which shrinks the query/key/value/output matrices and records `pruned_heads` in the
config, so `from_pretrained` rebuilds the right shapes.

FFN: `ffn` is the fraction of intermediate neurons removed from every layer, the same
number in each layer (chosen per layer by importance): the config's single
`intermediate_size` must describe every layer for the saved model to reload, so a global
ranking with uneven widths is not offered.

`recovery: true` then fine-tunes the pruned model briefly with distillation from the
unpruned input (compress/techniques/distillation.py: the distill stage's loss and cached teacher logits),
or from another stage's model (`teacher`), e.g. the task baseline a student was distilled
from: a better teacher than the student, and its logits over the same training examples
are already in the run's cache.

Architectures: the families in compress/core/architectures.py (BERT, DistilBERT, RoBERTa,
XLM-RoBERTa, ELECTRA, DeBERTa-v2/v3, ALBERT, MPNet, ModernBERT). How heads go depends on
what transformers rebuilds from config.json: per layer where it records `pruned_heads`; not
at all for DeBERTa-v2, MPNet and ModernBERT (`heads: 0` there; their FFN prunes). ALBERT shares one set of layer
weights across all its passes: pruning removes heads and neurons from that shared layer, so
every pass loses them (importance sums over the passes). Other families are refused at
validation when their config.json can be known then (the recipe's model, through finetune
and distill), else when the stage starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

# The per-family description (where the projections live) is shared with distillation.
from compress.core.architectures import ARCHS, Arch, get as get_arch, unsupported  # noqa: F401
from compress.core.registry import StageKind, StageResult
from compress.techniques.distillation import DistillSettings


class Config(DistillSettings):
    """Structured pruning; the training fields (epochs, lr, ...) and distillation fields
    (temperature, alpha, ...) apply to the recovery fine-tune."""

    heads: float = Field(0.5, ge=0, lt=1, description="Fraction of attention heads removed (0 keeps all).")
    ffn: float = Field(0.5, ge=0, lt=1, description="Fraction of FFN intermediate neurons removed from every layer.")
    scope: Literal["global", "per_layer"] = Field(
        "global",
        description="Rank heads over all layers (each layer's scores normalised) or remove the same "
        "fraction in every layer. FFN neurons are always removed evenly per layer.",
    )
    importance: Literal["gradient", "magnitude"] = Field(
        "gradient", description="|d loss / d mask| over training examples (Michel et al. 2019), or weight norms."
    )
    importance_examples: PositiveInt = Field(256, description="Training examples for `gradient` importance.")
    recovery: bool = Field(
        True, description="Fine-tune after pruning, distilling from the unpruned input (see the training fields)."
    )
    teacher: str | None = Field(
        None,
        description="Stage id of the model the recovery distils from instead of the unpruned input: a "
        "transformers classifier with the same tokenizer and labels, e.g. the baseline a student was "
        "distilled from (its cached logits are reused when the training examples are the same).",
    )

    @model_validator(mode="after")
    def _teacher(self):
        if self.teacher is not None and not self.recovery:
            raise ValueError("`teacher` is the recovery's teacher: set recovery: true, or drop `teacher`")
        if self.teacher is not None and self.hidden_weight > 0:
            raise ValueError("hidden_weight matches the pruned model's layers to its unpruned input's: "
                             "with another `teacher`, set hidden_weight: 0")
        return self

    def refs(self) -> dict[str, str]:
        return {} if self.teacher is None else {"teacher": self.teacher}


class Result(StageResult):
    heads_before: int
    heads_after: int
    pruned_heads: dict[int, list[int]]  # layer -> original head indices removed (all pruning so far)
    ffn_before: int
    ffn_after: int
    params_before: int
    params_after: int
    importance: str
    recovery: dict | None  # training stats and teacher cache, when recovery ran


def check_model(cfg: Config, model_config: dict) -> str | None:
    mt = model_config.get("model_type")
    arch = get_arch(mt)
    if arch is None:
        return unsupported("prune", mt)
    if cfg.heads > 0 and arch.heads == "none":
        return f"heads: {arch.heads_why}; set heads: 0 to prune only the FFN"
    return None


def _get(module, path: str):
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _set(module, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    setattr(_get(module, parent) if parent else module, name, value)


def layer_list(model, arch: Arch) -> list:
    """The distinct layer modules, in order (ALBERT: each shared layer once, groups flattened
    in the order transformers numbers them for `prune_heads`)."""
    found = [model.base_model]
    for part in arch.layers.split("."):
        found = [m for f in found for m in f] if part == "*" else [getattr(f, part) for f in found]
    return [layer for group in found for layer in group]


def head_dim(model) -> int:
    return model.config.hidden_size // model.config.num_attention_heads


def current_heads(model, layer: int) -> list[int]:
    """Original indices of the heads layer `layer` still has, in weight order."""
    gone = set((model.config.pruned_heads or {}).get(layer, []))
    return [h for h in range(model.config.num_attention_heads) if h not in gone]


def qkv_weights(layer, arch: Arch, d: int):
    """Query, key and value weights per head: [3, heads, d, hidden]."""
    import torch

    if len(arch.qkv) == 1:  # fused [3*heads*d, hidden]
        w = _get(layer, arch.qkv[0]).weight.detach()
        return w.view(3, -1, d, w.shape[1])
    return torch.stack([_get(layer, p).weight.detach().view(-1, d, layer_hidden(layer, arch)) for p in arch.qkv])


def importance_scores(model, arch: Arch, method: str, batches=(), on_batch=None):
    """Head scores [per layer: tensor [heads now]] and FFN scores [per layer: tensor [width]].

    `batches`: padded training batches (dicts of tensors incl. labels) for `gradient`;
    `on_batch(n)` after each (a progress bar's advance).
    Shared layers (ALBERT) run several times per forward pass: their hooks fire on every
    pass, so a score sums over the passes.
    """
    import torch
    import torch.nn.functional as F

    from compress.formats import model_inputs

    layers = layer_list(model, arch)
    d = head_dim(model)
    if method == "magnitude":
        heads, ffn = [], []
        for layer in layers:
            qkv = qkv_weights(layer, arch, d)  # [3, h, d, hidden]
            out = _get(layer, arch.attn_out).weight.detach()  # [hidden, h*d]
            out = out.view(out.shape[0], -1, d).transpose(0, 1)  # [h, hidden, d]
            heads.append((qkv.pow(2).sum(dim=(0, 2, 3)) + out.pow(2).sum(dim=(1, 2))).sqrt())
            w_in = _get(layer, arch.ffn_in).weight.detach()  # [I, hidden] ([2I, hidden] with GLU)
            w_out = _get(layer, arch.ffn_out).weight.detach()  # [hidden, I]
            rows = w_in.pow(2).sum(1)
            if arch.glu:  # a neuron has a value row and a gate row
                rows = rows.view(2, -1).sum(0)
            ffn.append((rows + w_out.pow(2).sum(0)).sqrt())
        return heads, ffn

    # gradient: masks of ones on each head's context vector and each neuron's activation
    # On the model's device: the hooks multiply them into activations there.
    dev = next(model.parameters()).device
    head_masks = [torch.ones(_get(l, arch.attn_out).in_features // d, device=dev, requires_grad=True) for l in layers]
    ffn_masks = [torch.ones(_get(l, arch.ffn_out).in_features, device=dev, requires_grad=True) for l in layers]
    hooks = []
    for layer, hm, fm in zip(layers, head_masks, ffn_masks):
        # The output projection's input is the heads' contexts side by side [B, T, h*d].
        hooks.append(_get(layer, arch.attn_out).register_forward_pre_hook(
            lambda mod, args, m=hm: (args[0] * m.repeat_interleave(d).to(args[0].dtype),)))
        # The FFN output projection's input is the neuron activations [B, T, I].
        hooks.append(_get(layer, arch.ffn_out).register_forward_pre_hook(
            lambda mod, args, m=fm: (args[0] * m.to(args[0].dtype),)))
    heads = [torch.zeros_like(m) for m in head_masks]
    ffn = [torch.zeros_like(m) for m in ffn_masks]
    was_training = model.training
    model.eval()  # no dropout: the scores describe the deployed network
    try:
        for batch in batches:
            loss = F.cross_entropy(model(**model_inputs(batch)).logits, batch["labels"])
            grads = torch.autograd.grad(loss, head_masks + ffn_masks)
            for acc, g in zip(heads + ffn, grads):
                acc += g.abs()
            if on_batch is not None:
                on_batch(int(batch["labels"].shape[0]))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return [h.cpu() for h in heads], [f.cpu() for f in ffn]


def layer_hidden(layer, arch: Arch) -> int:
    return _get(layer, arch.qkv[0]).in_features


def choose_heads(scores, fraction: float, scope: str) -> list[list[int]]:
    """Positions (in current weight order) of heads to remove per layer; never a layer's last."""
    import torch

    counts = [len(s) for s in scores]
    if scope == "per_layer":
        out = []
        for s in scores:
            k = min(round(fraction * len(s)), len(s) - 1)
            out.append(sorted(torch.argsort(s, stable=True)[:k].tolist()))
        return out
    # global: Michel et al. normalise each layer's scores by their L2 norm
    norm = [s / s.norm().clamp_min(1e-20) for s in scores]
    flat = sorted(((float(v), li, hi) for li, s in enumerate(norm) for hi, v in enumerate(s.tolist())))
    target = round(fraction * sum(counts))
    out: list[list[int]] = [[] for _ in scores]
    for _, li, hi in flat:
        if sum(map(len, out)) >= target:
            break
        if counts[li] - len(out[li]) > 1:
            out[li].append(hi)
    return [sorted(o) for o in out]


def choose_neurons(scores, fraction: float) -> list[list[int]]:
    """Neurons to keep per layer (sorted), the same count in every layer."""
    import torch

    width = len(scores[0])
    keep = width - min(round(fraction * width), width - 1)
    return [sorted(torch.argsort(s, descending=True, stable=True)[:keep].tolist()) for s in scores]


def apply_pruning(model, arch: Arch, remove_heads: list[list[int]], keep_neurons: list[list[int]]) -> None:
    """Physically removes heads (positions in current weight order) and keeps only the given
    FFN neurons in every layer (uniform width)."""
    import torch
    from transformers.pytorch_utils import prune_linear_layer

    layers = layer_list(model, arch)
    if any(remove_heads):
        assert arch.heads == "uneven", f"{arch.family}: heads cannot be removed"
        plan = {}
        for li, pos in enumerate(remove_heads):
            if pos:
                now = current_heads(model, li)
                plan[li] = [now[p] for p in pos]  # transformers wants original head indices
        model.prune_heads(plan)  # updates config.pruned_heads too
    widths = {len(k) for k in keep_neurons}
    assert len(widths) == 1, "FFN widths must be uniform"
    width_now = getattr(model.config, arch.width_key)
    for layer, keep in zip(layers, keep_neurons):
        index = torch.tensor(keep, dtype=torch.long)
        rows = torch.cat([index, index + width_now]) if arch.glu else index  # GLU: value and gate rows
        _set(layer, arch.ffn_in, prune_linear_layer(_get(layer, arch.ffn_in), rows, dim=0))
        _set(layer, arch.ffn_out, prune_linear_layer(_get(layer, arch.ffn_out), index, dim=1))
    setattr(model.config, arch.width_key, widths.pop())


def total_heads(model, arch: Arch) -> int:
    return sum(len(current_heads(model, i)) for i in range(len(layer_list(model, arch))))


def run(ctx) -> Result:
    import torch
    from transformers import AutoTokenizer

    from compress.techniques.distillation import distill_from
    from compress.core.errors import StageError
    from compress.formats import hf
    from compress.techniques.predict import encode, padded_batches
    from compress.techniques.train import set_seed

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    set_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    model = hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code).to(ctx.device)
    problem = check_model(cfg, model.config.to_dict())
    if problem:
        raise StageError(f"{ctx.stage_id}: {problem}")
    arch = get_arch(model.config.model_type)
    notes = []
    if arch.shared_layers:
        notes.append(f"{arch.family} shares its layer weights across its {model.config.num_hidden_layers} passes: "
                     f"heads and FFN neurons were removed from the shared layer, so every pass loses them")
    heads_before, ffn_before = total_heads(model, arch), getattr(model.config, arch.width_key)
    params_before = sum(p.numel() for p in model.parameters())

    batches = []
    if cfg.importance == "gradient":
        sub = ctx.data.train.select(range(min(cfg.importance_examples, len(ctx.data.train))))
        enc = encode(tokenizer, sub, cfg.max_length)
        for _, b in padded_batches(enc, tokenizer, 32, labels=True):
            batches.append({k: v.to(ctx.device) for k, v in b.items()})
    with ctx.progress(sum(int(b["labels"].shape[0]) for b in batches), "importance") as bar:
        head_scores, ffn_scores = importance_scores(model, arch, cfg.importance, batches, on_batch=bar.advance)
    remove = choose_heads(head_scores, cfg.heads, cfg.scope)
    keep = choose_neurons(ffn_scores, cfg.ffn)
    apply_pruning(model, arch, remove, keep)
    heads_after, ffn_after = total_heads(model, arch), getattr(model.config, arch.width_key)
    ctx.log(f"  heads {heads_before} -> {heads_after}, FFN width {ffn_before} -> {ffn_after} ({cfg.importance} importance)")

    recovery = None
    if cfg.recovery:
        source = ctx.input if cfg.teacher is None else ctx.refs["teacher"]
        if source.format != "hf":
            raise StageError(f"{ctx.stage_id}: teacher '{cfg.teacher}' is a {source.format} model; the recovery "
                             f"needs a transformers classifier (a finetune, distill or prune stage)")
        teacher = hf.load_model(source.path, ctx.recipe.model.trust_remote_code).eval().to(ctx.device)
        if cfg.teacher is not None:
            t_tok = AutoTokenizer.from_pretrained(source.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
            if t_tok.get_vocab() != tokenizer.get_vocab() or teacher.config.num_labels != model.config.num_labels:
                raise StageError(f"{ctx.stage_id}: teacher '{cfg.teacher}' has another tokenizer or label set than "
                                 f"the model it teaches; name a stage of the same chain")
        pairs = [(i, i) for i in range(model.config.num_hidden_layers)]
        model, stats, cache, _ = distill_from(ctx, model, teacher, tokenizer, cfg, pairs, f"{ctx.stage_id}: recovery",
                                              teacher_identity=source.identity)
        ctx.log(f"  recovery: {stats.examples} examples in {stats.seconds:.0f}s ({stats.examples_per_s:.0f} ex/s)")
        recovery = {"train": stats.as_dict(), "teacher_cache": cache, "teacher": cfg.teacher or "input"}

    model.eval()
    hf.save(model, tokenizer, ctx.out)
    pruned = {int(k): sorted(v) for k, v in (model.config.pruned_heads or {}).items()}
    return Result(
        format="hf",
        notes=notes,
        heads_before=heads_before,
        heads_after=heads_after,
        pruned_heads=pruned,
        ffn_before=ffn_before,
        ffn_after=ffn_after,
        params_before=params_before,
        params_after=sum(p.numel() for p in model.parameters()),
        importance=cfg.importance,
        recovery=recovery,
    )


KIND = StageKind(
    name="prune",
    summary="Structured pruning of attention heads and FFN neurons (Michel et al. importance), "
    "physically removed, with optional distillation recovery.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    ref_accepts=("hf",),  # the recovery's `teacher`
    produces="hf",
    check_model=check_model,
    keeps_architecture=lambda cfg: True,
)
