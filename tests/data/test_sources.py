import json

import pytest

from compress.core.errors import ModelSourceError
from compress.recipe.schema import ModelSpec
from compress.recipe.peek import peek_model_format
from compress.data.sources import check_model_folder, resolve_model


def test_packaged_default_model_resolves_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = resolve_model(ModelSpec(), tmp_path)
    assert (m.path / "model.safetensors").is_file()
    assert m.format == "checkpoint" and m.origin.startswith("package")
    assert json.loads((m.path / "config.json").read_text())["hidden_size"] == 384


def test_formats_are_peeked(tiny_checkpoint, tiny_classifier, tmp_path):
    assert peek_model_format(ModelSpec(source=str(tiny_checkpoint)), tmp_path) == "checkpoint"
    assert peek_model_format(ModelSpec(source=str(tiny_classifier)), tmp_path) == "hf"


def test_relative_folder_is_resolved_against_the_recipe(tiny_classifier):
    m = resolve_model(ModelSpec(source=tiny_classifier.name), tiny_classifier.parent)
    assert m.path == tiny_classifier and m.format == "hf"


def test_fingerprint_changes_with_weights(tiny_classifier, tmp_path):
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(tiny_classifier, copy)
    a = resolve_model(ModelSpec(source=str(copy)), tmp_path).fingerprint
    w = copy / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert resolve_model(ModelSpec(source=str(copy)), tmp_path).fingerprint != a


def test_uncached_hub_id_offline_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache") as exc:
        resolve_model(ModelSpec(source="someone/not-cached-model"), tmp_path)
    assert "\n" not in str(exc.value)


def test_missing_package_and_folder(tmp_path):
    with pytest.raises(ModelSourceError, match="not installed"):
        resolve_model(ModelSpec(source="package:no_such_pkg_xyz"), tmp_path)
    with pytest.raises(ModelSourceError, match="no such folder"):
        resolve_model(ModelSpec(source="./nope"), tmp_path)


def test_a_head_pruned_model_folder_is_a_valid_source(tiny_classifier, tmp_path):
    # A prune stage's output (config.pruned_heads, narrower attention matrices) used as
    # another recipe's model: the folder check builds the expected tensor names on the
    # meta device, where transformers' head pruning cannot run.
    import shutil

    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_classifier)
    model.prune_heads({0: [0], 1: [1]})
    out = tmp_path / "pruned"
    model.save_pretrained(out)
    for f in tiny_classifier.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out)
    assert json.loads((out / "config.json").read_text())["pruned_heads"]
    m = resolve_model(ModelSpec(source=str(out)), tmp_path)
    assert m.format == "hf" and m.path == out
    check_model_folder(out)  # what `compress run` does before the first stage
