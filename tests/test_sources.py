import json

import pytest

from compress.errors import ModelSourceError
from compress.recipe import ModelSpec
from compress.sources import peek_model_format, resolve_model


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
