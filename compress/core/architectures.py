"""Where the parts of each supported encoder family live, as data: the techniques that
reach inside a model (prune's head and FFN removal, distill's layer copy) read it, so a
family is one entry here, not a branch in each stage.

A low layer: no torch import, no stage import. Paths are dotted attribute paths; `layers`
starts at the model's base model (`model.base_model`) and may contain `*` to flatten nested
lists (ALBERT's layer groups); the other paths start at one layer module.

Head removal depends on what transformers rebuilds from the saved config.json (a pruned
model must reload with plain `from_pretrained`):
- `uneven`: the model implements `prune_heads`, which records `config.pruned_heads`, so
  each layer may keep its own heads (BERT, RoBERTa, ELECTRA, ALBERT ...).
- `none`: it does not, or the rebuilt shapes cannot follow: heads stay, the FFN can still
  be pruned; `heads_why` says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Arch:
    family: str  # display name
    layers: str  # from the base model to the layer list(s), e.g. "encoder.layer"
    qkv: tuple[str, ...]  # query, key, value projections [heads*d, hidden] each, or one fused [3*heads*d, hidden]
    attn_out: str  # attention output projection [hidden, heads*d]
    ffn_in: str  # [intermediate, hidden] ([2*intermediate, hidden] with `glu`)
    ffn_out: str  # [hidden, intermediate]
    width_key: str = "intermediate_size"  # config key of the FFN width
    heads: Literal["uneven", "none"] = "uneven"
    heads_why: str = ""  # why heads cannot be removed (heads == "none")
    glu: bool = False  # ffn_in holds [value; gate] halves: neuron j is rows j and intermediate + j
    shared_layers: bool = False  # one set of layer weights applied num_hidden_layers times (ALBERT)
    first_layer_special: bool = False  # layer 0 differs in structure: a copied student must keep it first


_BERT = Arch("BERT", "encoder.layer", ("attention.self.query", "attention.self.key", "attention.self.value"),
             "attention.output.dense", "intermediate.dense", "output.dense")

ARCHS: dict[str, Arch] = {
    "bert": _BERT,
    "roberta": Arch(**{**_BERT.__dict__, "family": "RoBERTa"}),
    "xlm-roberta": Arch(**{**_BERT.__dict__, "family": "XLM-RoBERTa"}),
    "electra": Arch(**{**_BERT.__dict__, "family": "ELECTRA"}),
    "distilbert": Arch("DistilBERT", "transformer.layer", ("attention.q_lin", "attention.k_lin", "attention.v_lin"),
                       "attention.out_lin", "ffn.lin1", "ffn.lin2", width_key="hidden_dim"),
    "deberta-v2": Arch(
        "DeBERTa-v2/v3", "encoder.layer",
        ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"),
        "attention.output.dense", "intermediate.dense", "output.dense", heads="none",
        heads_why="transformers' DeBERTa-v2 has no head pruning, and builds its attention output "
        "hidden_size wide, so a model with fewer heads does not reload",
    ),
    "albert": Arch(
        "ALBERT", "encoder.albert_layer_groups.*.albert_layers",
        ("attention.query", "attention.key", "attention.value"), "attention.dense", "ffn", "ffn_output",
        shared_layers=True,
    ),
    "mpnet": Arch(
        "MPNet", "encoder.layer", ("attention.attn.q", "attention.attn.k", "attention.attn.v"), "attention.attn.o",
        "intermediate.dense", "output.dense", heads="none",
        heads_why="MPNet adds one relative-position bias per head, shared by all layers, so a layer cannot "
        "lose heads alone",
    ),
    "modernbert": Arch(
        "ModernBERT", "layers", ("attn.Wqkv",), "attn.Wo", "mlp.Wi", "mlp.Wo", heads="none",
        heads_why="ModernBERT derives its head size (and rotary embedding) from hidden_size / "
        "num_attention_heads, so a model with fewer heads does not reload",
        glu=True, first_layer_special=True,
    ),
}

# Stages that need no per-family description: what an unsupported family can still use.
GENERIC_STAGES = ("finetune", "quantize_dynamic", "distill with `student`", "export_onnx", "quantize_onnx",
                  "load_4bit", "cascade")


def unsupported(what: str, model_type: str | None) -> str:
    """The one-line refusal for a model type without an entry (`what`: the stage or option)."""
    return (f"{what} supports model types {', '.join(sorted(ARCHS))}; this model is '{model_type}' "
            f"(it can still use {', '.join(GENERIC_STAGES)})")


def get(model_type: str | None) -> Arch | None:
    return ARCHS.get(model_type or "")
