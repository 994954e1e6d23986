import json
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest
import torch

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from tests.conftest import ROOT, run_stage, tiny_recipe

torch.set_num_threads(1)

NO_RECOVERY = {"recovery": False, "importance_examples": 64, "max_length": 32}
# Removed units of the zeroed model: layer -> heads, and FFN neurons per layer (of 64).
DEAD_HEADS = {0: [1, 2], 1: [0]}
DEAD_NEURONS = {0: list(range(0, 64, 2)), 1: list(range(32, 64))}


def _inputs(path, texts=("the film was good", "a dull , boring plot and a bad cast")):
    from transformers import AutoTokenizer

    return dict(AutoTokenizer.from_pretrained(path)(list(texts), padding=True, return_tensors="pt"))


def _logits(model, path):
    with torch.inference_mode():
        return model.eval()(**_inputs(path)).logits


@pytest.fixture
def zeroed_classifier(tiny_classifier, tmp_path):
    """The tiny classifier with some heads and FFN neurons switched off by zero weights:
    they contribute nothing, so both importance measures rank them last."""
    import shutil

    from transformers import AutoModelForSequenceClassification

    d = tmp_path / "zeroed"
    shutil.copytree(tiny_classifier, d)
    model = AutoModelForSequenceClassification.from_pretrained(d)
    dh = 32 // 4
    with torch.no_grad():
        for p in model.parameters():  # initial weights (std 0.02) give nearly constant logits
            if p.dim() == 2:
                p.mul_(10)
        for li, heads in DEAD_HEADS.items():
            att = model.bert.encoder.layer[li].attention
            for h in heads:
                cols = slice(h * dh, (h + 1) * dh)
                for lin in (att.self.query, att.self.key, att.self.value):
                    lin.weight[cols] = 0
                    lin.bias[cols] = 0
                att.output.dense.weight[:, cols] = 0
        for li, neurons in DEAD_NEURONS.items():
            layer = model.bert.encoder.layer[li]
            layer.intermediate.dense.weight[neurons] = 0
            layer.intermediate.dense.bias[neurons] = 0
            layer.output.dense.weight[:, neurons] = 0
    model.save_pretrained(d)
    return d


@pytest.mark.parametrize("importance", ["gradient", "magnitude"])
def test_removing_zero_importance_units_keeps_the_logits(zeroed_classifier, tiny_data, tmp_path, importance):
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "pruned"
    result = run_stage(zeroed_classifier, tiny_data, out, "prune",
                       {**NO_RECOVERY, "heads": 3 / 8, "ffn": 0.5, "importance": importance})
    assert result.pruned_heads == DEAD_HEADS
    assert (result.heads_before, result.heads_after, result.ffn_before, result.ffn_after) == (8, 5, 64, 32)
    before = AutoModelForSequenceClassification.from_pretrained(zeroed_classifier)
    after = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True)
    torch.testing.assert_close(_logits(after, out), _logits(before, zeroed_classifier), atol=1e-5, rtol=0)
    # The check can fail: pruning other units of the same model moves the logits.
    other = run_stage(zeroed_classifier, tiny_data, tmp_path / "other", "prune",
                      {**NO_RECOVERY, "heads": 0.5, "ffn": 0.5, "scope": "per_layer", "importance": importance})
    moved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "other")
    assert other.pruned_heads != DEAD_HEADS
    assert (_logits(moved, tmp_path / "other") - _logits(before, zeroed_classifier)).abs().max() > 1e-2


def test_pruned_model_shrinks_and_reloads_in_a_fresh_process(tiny_classifier, tiny_data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "pruned"
    result = run_stage(tiny_classifier, tiny_data, out, "prune", {**NO_RECOVERY, "heads": 0.5, "ffn": 0.5})
    assert result.params_after < result.params_before
    model = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True)
    layer = model.bert.encoder.layer[0]
    assert layer.intermediate.dense.weight.shape == (32, 32) and layer.output.dense.weight.shape == (32, 32)
    assert model.config.intermediate_size == 32
    heads = [model.bert.encoder.layer[i].attention.self.num_attention_heads for i in range(2)]
    assert sum(heads) == 4 and min(heads) >= 1
    assert layer.attention.self.query.weight.shape[0] == heads[0] * 8
    assert (tmp_path / "pruned" / "model.safetensors").stat().st_size < (tiny_classifier / "model.safetensors").stat().st_size
    config = json.loads((out / "config.json").read_text())
    assert sum(map(len, config["pruned_heads"].values())) == 4

    in_memory = _logits(model, out).numpy()
    script = (
        "import sys, json, torch\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
        "p = sys.argv[1]\n"
        "m = AutoModelForSequenceClassification.from_pretrained(p, use_safetensors=True).eval()\n"
        "x = AutoTokenizer.from_pretrained(p)(['the film was good', 'a dull , boring plot and a bad cast'],"
        " padding=True, return_tensors='pt')\n"
        "with torch.inference_mode():\n"
        "    print(json.dumps(m(**x).logits.tolist()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fresh = np.array(json.loads(proc.stdout.strip().splitlines()[-1]))
    np.testing.assert_allclose(fresh, in_memory, atol=1e-5)


def test_a_layer_never_loses_its_last_head():
    from compress.stages.prune import choose_heads, choose_neurons

    scores = [torch.tensor([0.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 2.0, 3.0, 4.0])]
    for scope in ("global", "per_layer"):
        removed = choose_heads(scores, 0.9, scope)
        assert all(len(r) <= 3 for r in removed), scope
    assert choose_heads(scores, 0.5, "global") == [[0, 1, 2], [0]]
    assert choose_heads(scores, 0.5, "per_layer") == [[0, 1], [0, 1]]
    keep = choose_neurons([torch.tensor([3.0, 1.0, 2.0, 0.0]), torch.tensor([0.0, 1.0, 2.0, 3.0])], 0.5)
    assert keep == [[0, 2], [2, 3]]


def test_pruning_twice_counts_heads_in_original_numbering(tiny_classifier, tiny_data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    run_stage(tiny_classifier, tiny_data, tmp_path / "p1", "prune", {**NO_RECOVERY, "heads": 0.25, "ffn": 0.25})
    second = run_stage(tmp_path / "p1", tiny_data, tmp_path / "p2", "prune", {**NO_RECOVERY, "heads": 0.34, "ffn": 0.25})
    assert second.heads_before == 6 and second.heads_after == 4 and second.ffn_after == 36
    assert sum(map(len, second.pruned_heads.values())) == 4
    assert all(0 <= h < 4 for hs in second.pruned_heads.values() for h in hs)
    AutoModelForSequenceClassification.from_pretrained(tmp_path / "p2", use_safetensors=True)


def _recipe(model, data, settings):
    raw = tiny_recipe(model, data)
    raw["stages"] = [{"id": "pruned", "uses": "prune", "with": settings}]
    raw["budget"] = {"baseline": "pruned"}
    return raw


@pytest.mark.parametrize("settings, key", [
    ({"heads": 1.5}, "stages[0].with.heads"),
    ({"ffn": -0.1}, "stages[0].with.ffn"),
    ({"heads": 1.0}, "stages[0].with.heads"),
    ({"importance": "random"}, "stages[0].with.importance"),
    ({"head": 0.5}, "stages[0].with.head"),
])
def test_bad_settings_fail_validation_naming_the_key(tiny_classifier, tiny_data, settings, key):
    with pytest.raises(RecipeError) as err:
        validate_recipe(_recipe(tiny_classifier, tiny_data, settings))
    assert err.value.key == key


def test_unsupported_architecture_is_a_validation_error(tiny_data, tmp_path):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2ForSequenceClassification"]}))
    with pytest.raises(RecipeError, match="gpt2") as err:
        validate_recipe(_recipe(model, tiny_data, {}))
    assert err.value.key == "stages[0].uses"


@pytest.mark.parametrize("model_type", ["distilbert", "roberta"])
def test_other_architectures_prune_and_reload(model_type, tmp_path):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from compress.stages.prune import ARCHS, apply_pruning, choose_heads, choose_neurons, importance_scores

    sizes = {"distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64),
             "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)}
    config = AutoConfig.for_model(model_type, vocab_size=100, max_position_embeddings=64, **sizes[model_type])
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    x = {"input_ids": torch.randint(3, 100, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    arch = ARCHS[model_type]
    heads, ffn = importance_scores(model, arch, "gradient", [{**x, "labels": torch.tensor([0, 1])}])
    assert [len(h) for h in heads] == [4, 4] and [len(f) for f in ffn] == [64, 64]
    apply_pruning(model, arch, choose_heads(heads, 0.5, "global"), choose_neurons(ffn, 0.25))
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path, use_safetensors=True).eval()
    assert getattr(reloaded.config, arch.width_key) == 48
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in model.parameters())
    with torch.inference_mode():
        torch.testing.assert_close(reloaded(**x).logits, model(**x).logits, atol=1e-5, rtol=0)


def test_recovery_distils_from_another_stage_as_teacher(tiny_classifier, tiny_classifier_4l, tiny_data, tmp_path):
    """`teacher` names the model the recovery distils from: its logits (not the unpruned
    input's) are cached and trained towards, under its own fingerprint."""
    from compress.data.artifacts import Artifact
    from compress.data.context import StageContext
    from compress.tasks.classification.data import Data
    from compress.techniques.distillation import teacher_cache_key
    from compress.core.registry import get_stage

    settings = {"heads": 0.5, "ffn": 0.5, "importance_examples": 32, "max_length": 32, "epochs": 1, "lr": 1e-3,
                "teacher_precision": "fp32"}
    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["data"]["max_train_examples"] = 200
    raw["stages"] = [{"id": "big", "uses": "finetune", "with": {"epochs": 1}},
                     {"id": "small", "uses": "prune", "from": "big", "with": {**settings, "teacher": "big"}}]
    raw["budget"] = {"baseline": "big"}
    recipe = validate_recipe(raw)
    data = Data(recipe.data, recipe.base_dir)

    def run(teacher_path: Path, teacher_fp: str, out: Path):
        ctx = StageContext(
            stage_id="small", config=recipe.stage("small").config,
            input=Artifact("input", tiny_classifier, "hf", "input-fp"), out=out, recipe=recipe,
            refs={"teacher": Artifact("big", teacher_path, "hf", teacher_fp)},
            _data=lambda: data, log=lambda m: None, threads=1, cache_root=tmp_path / "cache",
        )
        out.mkdir()
        return get_stage("prune").run(ctx)

    result = run(tiny_classifier_4l, "teacher-fp", tmp_path / "a")
    assert result.recovery["teacher"] == "big"
    assert result.recovery["teacher_cache"]["key"] == teacher_cache_key("teacher-fp", data.train_fingerprint, 32, 200)
    from transformers import AutoTokenizer

    from compress.formats import hf
    from compress.techniques.predict import encode, predict_logits

    tok = AutoTokenizer.from_pretrained(tiny_classifier_4l)
    expected = predict_logits(hf.load_model(tiny_classifier_4l), tok, encode(tok, data.train, 32))
    np.testing.assert_allclose(np.load(tmp_path / "a" / "teacher_logits.npy"), expected, atol=1e-5)


@pytest.mark.parametrize("settings, message", [
    ({"teacher": "big", "recovery": False}, "recovery: true"),
    ({"teacher": "big", "hidden_weight": 1.0}, "hidden_weight: 0"),
])
def test_teacher_needs_recovery_and_no_hidden_loss(tiny_classifier, tiny_data, settings, message):
    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["stages"] = [{"id": "big", "uses": "finetune", "with": {"epochs": 1}},
                     {"id": "small", "uses": "prune", "from": "big", "with": settings}]
    raw["budget"] = {"baseline": "big"}
    with pytest.raises(RecipeError, match=message):
        validate_recipe(raw)
