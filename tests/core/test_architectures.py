"""Every supported encoder family through every stage kind that applies to it: tiny models
built from configs, each with a tokenizer of its own kind (WordPiece, byte-level BPE,
Unigram) trained offline with the tokenizers library on the synthetic sentences. Where a
technique cannot apply (heads of MPNet, DeBERTa-v2, ModernBERT), validation refuses in one
line before anything trains."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from compress.core.architectures import ARCHS
from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from tests.conftest import synthetic_rows, tiny_recipe

torch.set_num_threads(1)

# family -> (tokenizer kind, transformers tokenizer class, special tokens: cls, sep, pad, unk, mask)
_SPM = ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
_ROBERTA = ("<s>", "</s>", "<pad>", "<unk>", "<mask>")
FAMILIES = {
    "bert": ("wordpiece", "BertTokenizerFast", _SPM),
    "distilbert": ("wordpiece", "DistilBertTokenizerFast", _SPM),
    "electra": ("wordpiece", "ElectraTokenizerFast", _SPM),
    "mpnet": ("wordpiece", "MPNetTokenizerFast", _ROBERTA),
    "roberta": ("bpe", "RobertaTokenizerFast", _ROBERTA),
    "modernbert": ("bpe", "PreTrainedTokenizerFast", _SPM),
    "xlm-roberta": ("unigram", "XLMRobertaTokenizerFast", _ROBERTA),
    "deberta-v2": ("unigram", "DebertaV2TokenizerFast", _SPM),
    "albert": ("unigram", "AlbertTokenizerFast", _SPM),
}


def _installed(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


FAMILIES = {k: v for k, v in FAMILIES.items() if _installed(k)}
FAST = {"epochs": 1, "batch_size": 16, "max_length": 32}


def test_every_supported_family_is_tested():
    assert set(ARCHS) - {"modernbert"} <= set(FAMILIES)


def build_tokenizer(model_type: str, folder: Path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    import transformers

    kind, cls_name, (cls, sep, pad, unk, mask) = FAMILIES[model_type]
    specials = [pad, unk, cls, sep, mask]
    corpus = [t for t, _ in synthetic_rows(300, 0)]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=150, special_tokens=specials)
    elif kind == "bpe":  # byte-level, as RoBERTa and ModernBERT
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=350, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # SentencePiece-style Unigram, as XLM-R, DeBERTa-v3 and ALBERT
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=150, special_tokens=specials, unk_token=unk)
    tok.train_from_iterator(corpus, trainer)
    ids = {t: tok.token_to_id(t) for t in (cls, sep)}
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=list(ids.items()))
    fast = getattr(transformers, cls_name)(
        tokenizer_object=tok, cls_token=cls, sep_token=sep, pad_token=pad, unk_token=unk, mask_token=mask,
        bos_token=cls, eos_token=sep)
    fast.save_pretrained(folder)
    return fast


def build_model(model_type: str, folder: Path) -> Path:
    """A tiny random classifier of the family with its tokenizer: hidden 64, 2 layers, 4 heads
    (the 4-bit CPU kernels want multiples of 64 inputs)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    tok = build_tokenizer(model_type, folder)
    ids = dict(pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    if model_type == "distilbert":
        sizes = dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128)
    else:
        sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    if model_type in ("albert", "electra"):
        sizes["embedding_size"] = 32
    if model_type == "modernbert":
        ids.update(cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id)
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), max_position_embeddings=130, num_labels=2,
                                  **sizes, **ids)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    return folder


def run(uses: str, settings: dict, src: Path, fmt: str, data: Path, out: Path, model: Path, refs=None):
    from compress.data.artifacts import Artifact
    from compress.data.context import StageContext
    from compress.tasks.classification.data import Data
    from compress.core.registry import get_stage

    raw = tiny_recipe(model, data)
    raw["data"]["max_train_examples"] = 64
    raw["stages"] = raw["stages"][:1]
    recipe = validate_recipe(raw)
    kind = get_stage(uses)
    out.mkdir(parents=True)
    dataset = Data(recipe.data, recipe.base_dir)
    ctx = StageContext(
        stage_id=out.name, config=kind.config.model_validate(settings), input=Artifact(src.name, src, fmt, src.name),
        out=out, recipe=recipe, refs=refs or {}, _data=lambda: dataset, log=lambda m: None, threads=1,
        cache_root=out.parent / "cache",
    )
    result = kind.run(ctx)
    assert result.format == kind.produces
    return result


def _bnb_problem() -> str | None:
    try:
        import bitsandbytes  # noqa: F401

        from compress.formats.bnb_4bit import check_backend
    except ImportError as exc:
        return f"bitsandbytes unavailable: {exc}"
    return check_backend("cpu")


def _prune_settings(model_type: str) -> dict:
    heads = 0.5 if ARCHS[model_type].heads == "uneven" else 0.0
    return {"heads": heads, "ffn": 0.5, "recovery": False, "importance_examples": 16, "max_length": 32}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_through_every_stage(model_type, tiny_data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from compress.data.artifacts import Artifact
    from compress.formats import load_predictor

    model = build_model(model_type, tmp_path / "model")
    # Validation follows the architecture from the model through finetune to prune.
    raw = tiny_recipe(model, tiny_data)
    raw["stages"] = [raw["stages"][0], {"id": "pruned", "uses": "prune", "from": "baseline",
                                        "with": _prune_settings(model_type)}]
    validate_recipe(raw)

    base = tmp_path / "baseline"
    run("finetune", {**FAST, "lr": 1e-3}, model, "hf", tiny_data, base, model)
    run("quantize_dynamic", {"calibration_examples": 16, "sensitivity_examples": 8, "max_length": 32},
        base, "hf", tiny_data, tmp_path / "int8", model)

    student = run("distill", FAST, base, "hf", tiny_data, tmp_path / "student", model)
    if ARCHS[model_type].shared_layers:  # ALBERT: fewer passes of the same weights
        assert student.not_smaller and "shares" in student.not_smaller and student.params == student.params_teacher
        assert any(n.startswith("not smaller") for n in student.notes)
    else:
        assert student.not_smaller is None and student.params < student.params_teacher

    pruned = run("prune", _prune_settings(model_type), base, "hf", tiny_data, tmp_path / "pruned", model)
    assert pruned.ffn_after == pruned.ffn_before // 2 and pruned.params_after < pruned.params_before
    if ARCHS[model_type].heads == "uneven":
        assert pruned.heads_after < pruned.heads_before
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "pruned", use_safetensors=True)
    assert sum(p.numel() for p in reloaded.parameters()) == pruned.params_after

    # The pruned model goes on to ONNX: export (parity checked inside), fusion, INT8.
    exported = run("export_onnx", {"parity_examples": 16, "max_length": 32}, tmp_path / "pruned", "hf", tiny_data,
                   tmp_path / "onnx", model)
    assert exported.parity["max_abs_diff"] < 1e-3
    run("optimize_onnx", {"parity_examples": 16, "max_length": 32}, tmp_path / "onnx", "onnx", tiny_data,
        tmp_path / "onnx_opt", model)
    run("quantize_onnx", {"calibration_examples": 16, "parity_examples": 16, "max_length": 32},
        tmp_path / "onnx_opt", "onnx", tiny_data, tmp_path / "onnx_int8", model)
    onnx_int8 = load_predictor("onnx", tmp_path / "onnx_int8", "cpu", 1)
    assert onnx_int8.num_params() > 0

    if _bnb_problem() is None:
        run("load_4bit", {"parity_examples": 8, "max_length": 32}, base, "hf", tiny_data, tmp_path / "q4", model)

    casc = run("cascade", {"large": "baseline", "calibration_examples": 32, "max_length": 32},
               tmp_path / "onnx_int8", "onnx", tiny_data, tmp_path / "cascade", model,
               refs={"large": Artifact("baseline", base, "hf", "baseline")})
    assert casc.format == "cascade"


@pytest.mark.parametrize("model_type", [m for m in sorted(FAMILIES) if ARCHS[m].heads == "none"])
def test_head_pruning_is_refused_at_validation_where_heads_cannot_reload(model_type, tiny_data, tmp_path):
    model = build_model(model_type, tmp_path / "model")
    raw = tiny_recipe(model, tiny_data)
    raw["stages"] = [raw["stages"][0],
                     {"id": "student", "uses": "distill", "from": "baseline", "with": FAST},
                     {"id": "pruned", "uses": "prune", "from": "student", "with": {"heads": 0.5}}]
    with pytest.raises(RecipeError) as err:
        validate_recipe(raw)
    assert err.value.key == "stages[2].with.heads"
    assert "\n" not in str(err.value) and "heads: 0" in str(err.value)
    raw["stages"][2]["with"] = {"heads": 0.0}
    validate_recipe(raw)  # the FFN alone prunes


def test_unsupported_family_is_refused_at_validation_through_finetune(tiny_data, tmp_path):
    import json

    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2ForSequenceClassification"]}))
    raw = tiny_recipe(model, tiny_data)
    raw["stages"] = [raw["stages"][0], {"id": "pruned", "uses": "prune", "from": "baseline", "with": {}}]
    with pytest.raises(RecipeError) as err:
        validate_recipe(raw)
    message = str(err.value)
    assert err.value.key == "stages[1].uses" and "'gpt2'" in message and "finetune" in message
    # Another student ends what validation knows: the check waits for the stage to run.
    raw["stages"].insert(1, {"id": "student", "uses": "distill", "from": "baseline", "with": {"student": str(model)}})
    raw["stages"][2]["from"] = "student"
    validate_recipe(raw)


def test_modernbert_student_keeps_layer_zero_first(tiny_data, tmp_path):
    if "modernbert" not in FAMILIES:
        pytest.skip("transformers without ModernBERT")
    from compress.techniques.distillation import default_layers

    assert default_layers(4, "modernbert") == [0, 3] and default_layers(4, "bert") == [1, 3]
    model = build_model("modernbert", tmp_path / "model")
    raw = tiny_recipe(model, tiny_data)
    raw["stages"] = [{"id": "student", "uses": "distill", "with": {"layers": [1]}}]
    with pytest.raises(RecipeError, match="layer 0") as err:
        validate_recipe(raw)
    assert err.value.key == "stages[0].with.layers"


def test_optimize_onnx_copies_a_graph_of_a_type_without_fusion_rules(tiny_classifier, tiny_data, tmp_path):
    import json

    run("export_onnx", {"parity_examples": 8, "max_length": 32}, tiny_classifier, "hf", tiny_data,
        tmp_path / "onnx", tiny_classifier)
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    odd = tmp_path / "odd"
    shutil.copytree(tmp_path / "onnx", odd)
    (odd / "config.json").write_text(json.dumps({**config, "model_type": "made-up"}))
    result = run("optimize_onnx", {}, odd, "onnx", tiny_data, tmp_path / "out", tiny_classifier)
    assert "no fusion rules for model type 'made-up'" in result.notes[0]
    assert (tmp_path / "out" / "model.onnx").read_bytes() == (odd / "model.onnx").read_bytes()
    fused = run("optimize_onnx", {}, tmp_path / "onnx", "onnx", tiny_data, tmp_path / "out2", tiny_classifier)
    assert not any("no fusion rules" in n for n in fused.notes)
    assert np.isfinite(fused.parity["max_abs_diff"])
