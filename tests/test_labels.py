"""Class names from the data to every variant's config.json, and the label and length checks
that can only be made once the model is at hand (run time)."""

import json

import pytest

from compress.recipe.schema import validate_recipe
from compress.run.runner import run_recipe
from tests.conftest import synthetic_rows, tiny_recipe

NAMES = {0: "negative", 1: "positive"}


@pytest.fixture(scope="module")
def worded_data(tmp_path_factory):
    """The synthetic sentiment set as a CSV whose labels are words, as most real datasets are."""
    d = tmp_path_factory.mktemp("worded")
    for name, rows in (("train", synthetic_rows(300, 0)), ("dev", synthetic_rows(48, 1))):
        (d / f"{name}.csv").write_text("sentence,label\n" + "".join(f"{t},{NAMES[y]}\n" for t, y in rows))
    return d


def test_named_labels_reach_every_variant_and_a_pipeline_answers_names(tiny_checkpoint, worded_data, tmp_path):
    from transformers import pipeline

    raw = tiny_recipe(tiny_checkpoint, worded_data)
    raw["data"]["max_train_examples"] = 200
    raw["stages"][0]["with"]["epochs"] = 1
    raw["stages"].append({"id": "onnx", "uses": "export_onnx", "from": "baseline", "with": {"parity_examples": 16}})
    raw["benchmark"].update(batch_sizes=[1], max_latency_examples=4, warmup=1)
    raw["budget"]["max_accuracy_drop"] = 100.0
    report = run_recipe(validate_recipe(raw), tmp_path, log=lambda m: None, threads=1)
    run = tmp_path / "tiny"
    assert all(r["ok"] for r in report["rows"]), [r.get("error") for r in report["rows"]]  # they load as stamped
    for vid in ("baseline", "int8", "onnx"):
        config = json.loads((run / vid / "config.json").read_text())
        assert config["id2label"] == {"0": "negative", "1": "positive"}, vid
        assert config["label2id"] == {"negative": 0, "positive": 1}, vid
    answer = pipeline("text-classification", model=str(run / "baseline"))("the movie was great")
    assert answer[0]["label"] in ("negative", "positive")
    assert report["manifest"]["data"]["label_names"] == ["negative", "positive"]
    # The [UNK] share of the eval split is a data note of every report.
    assert report["notes"][0].startswith("data: 0.00% of the eval split's ") and "[UNK]" in report["notes"][0]
    assert report["manifest"]["data"]["eval_unk_share"] == 0.0


def test_onnx_variant_answers_names_through_optimum(tiny_checkpoint, worded_data, tmp_path):
    from optimum.onnxruntime import ORTModelForSequenceClassification
    from transformers import AutoTokenizer, pipeline

    raw = tiny_recipe(tiny_checkpoint, worded_data)
    raw["data"]["max_train_examples"] = 64
    raw["stages"][0]["with"]["epochs"] = 1
    raw["stages"][1] = {"id": "onnx", "uses": "export_onnx", "from": "baseline", "with": {"parity_examples": 8}}
    raw["benchmark"].update(batch_sizes=[1], max_latency_examples=4, warmup=1)
    raw["budget"]["max_accuracy_drop"] = 100.0
    run_recipe(validate_recipe(raw), tmp_path, log=lambda m: None, threads=1)
    folder = tmp_path / "tiny" / "onnx"
    clf = pipeline("text-classification", model=ORTModelForSequenceClassification.from_pretrained(folder),
                   tokenizer=AutoTokenizer.from_pretrained(folder))
    assert clf("the plot was dull")[0]["label"] in ("negative", "positive")


def test_a_head_with_another_label_count_is_an_error_before_anything_runs(cli, write_recipe, tiny_data,
                                                                         tokenizer_dir, tmp_path):
    """26.5: a 3-label classifier used as the baseline on 2-class data (scored 0% and deployed
    with exit 0 before) is a one-line error, exit 2, here found at run time (the recipe does
    not say how many classes there are)."""
    import shutil

    import torch
    from transformers import BertForSequenceClassification

    from tests.conftest import tiny_config

    three = tmp_path / "three"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_config(num_labels=3)).save_pretrained(three)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, three)
    raw = tiny_recipe(three, tiny_data)
    raw["stages"] = [{"id": "int8", "uses": "quantize_dynamic", "from": "model",
                      "with": {"calibration_examples": 16, "sensitivity_examples": 8}}]
    raw["budget"]["baseline"] = "model"
    path = write_recipe(raw)
    assert cli("validate", path)[0] == 0  # the class count is in the data, not the recipe
    code, out, err = cli("run", path, "--artifacts", tmp_path / "art")
    lines = [ln for ln in err.strip().splitlines() if "error" in ln.lower()]
    assert code == 2, err
    assert len(lines) == 1 and "the data has 2 classes but the model's classification head has 3" in lines[0]
    assert not (tmp_path / "art" / "tiny" / "int8").exists()


def test_a_length_beyond_the_positions_found_at_run_time_exits_2(cli, write_recipe, tiny_checkpoint, tiny_data,
                                                                tmp_path, monkeypatch):
    """26.10: where validation cannot read the model's config (a hub model not yet
    downloaded), the run checks it before any stage: exit 2, one line naming the key."""
    import compress.recipe.peek

    raw = tiny_recipe(tiny_checkpoint, tiny_data)
    raw["stages"][0]["with"]["max_length"] = 200  # tiny BERT: 128 positions
    path = write_recipe(raw)
    real = compress.recipe.peek.peek_model_format
    monkeypatch.setattr(compress.recipe.peek, "peek_model_format", lambda *a: None)  # "not at hand"
    assert cli("validate", path)[0] == 0
    code, _, err = cli("run", path, "--artifacts", tmp_path / "art")
    assert code == 2, err
    assert "stages[0].with.max_length: 200 tokens is more than the model takes (128" in err
    assert not (tmp_path / "art" / "tiny" / "baseline").exists()
    monkeypatch.setattr(compress.recipe.peek, "peek_model_format", real)
    assert cli("validate", path)[0] == 2  # at hand: validation says it first


def test_a_tokenizer_trim_vocab_cannot_take_is_refused_before_the_baseline_trains(cli, write_recipe, tiny_checkpoint,
                                                                                  tiny_data, tmp_path, monkeypatch):
    """Where validation cannot read the model's tokenizer.json (a hub model not yet
    downloaded), the run reads it before any stage, not after the baseline has trained."""
    import shutil

    import compress.recipe.peek
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = tmp_path / "wordlevel"
    shutil.copytree(tiny_checkpoint, model)
    vocab = json.loads((tiny_checkpoint / "tokenizer.json").read_text())["model"]["vocab"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(model / "tokenizer.json"))
    raw = tiny_recipe(model, tiny_data)
    raw["stages"][1] = {"id": "trimmed", "uses": "trim_vocab", "from": "baseline"}
    path = write_recipe(raw)
    monkeypatch.setattr(compress.recipe.peek, "peek_tokenizer", lambda *a: None)  # "not at hand"
    assert cli("validate", path)[0] == 0
    code, _, err = cli("run", path, "--artifacts", tmp_path / "art")
    assert code == 2 and "stages[1].uses: trim_vocab trims WordPiece, BPE, Unigram tokenizers, not this model's " \
                          "(WordLevel)" in err
    assert not (tmp_path / "art" / "tiny" / "baseline").exists()
