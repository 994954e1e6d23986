"""compress.techniques.classify: a variant folder answers texts as a transformers pipeline does."""

import json
import shutil

import pytest
import torch

from compress.techniques.classify import folder_format, load_classifier
from compress.formats import write_labels
from tests.conftest import tiny_config

TEXTS = ["a gripping, beautifully shot film", "dull and far too long", "fine"]


def _classifier_folder(path, tokenizer_dir, seed):
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    BertForSequenceClassification(tiny_config(num_labels=2)).eval().save_pretrained(path)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, path)
    assert write_labels(path, {0: "negative", 1: "positive"})
    (path / "result.json").write_text(json.dumps({"format": "hf"}))
    return path


def _torch_labels(path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        probs = model(**tok(TEXTS, padding=True, return_tensors="pt")).logits.softmax(-1)
    return [model.config.id2label[int(i)] for i in probs.argmax(-1)], probs.max(-1).values.tolist()


def test_an_hf_folder_answers_with_its_label_names(tmp_path, tokenizer_dir):
    folder = _classifier_folder(tmp_path / "student", tokenizer_dir, 0)
    out = load_classifier(folder, threads=1)(TEXTS)
    labels, scores = _torch_labels(folder)
    assert [o[0]["label"] for o in out] == labels and set(labels) <= {"negative", "positive"}
    assert [o[0]["score"] for o in out] == pytest.approx(scores, abs=1e-5)
    assert load_classifier(folder, threads=1)("fine")[0][0]["label"] in ("negative", "positive")


def test_a_cascade_folder_answers_through_its_members(tmp_path, tokenizer_dir):
    run = tmp_path / "run"
    small = _classifier_folder(run / "small", tokenizer_dir, 1)
    large = _classifier_folder(run / "large", tokenizer_dir, 2)
    (run / "cascade").mkdir()
    spec = {"small": {"stage": "small", "format": "hf", "path": "small"},
            "large": {"stage": "large", "format": "hf", "path": "large"}, "threshold": 1.0}
    for threshold, member in ((1.0, large), (1e-6, small)):  # everything routed on / nothing routed
        spec["threshold"] = threshold
        (run / "cascade" / "cascade.json").write_text(json.dumps(spec))
        assert folder_format(run / "cascade") == "cascade"
        out = load_classifier(run / "cascade", threads=1)(TEXTS)
        labels, scores = _torch_labels(member)
        assert [o[0]["label"] for o in out] == labels
        assert [o[0]["score"] for o in out] == pytest.approx(scores, abs=1e-5)


def test_a_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such variant folder"):
        load_classifier(tmp_path / "nope")


@pytest.mark.parametrize("edit", ["config", "weights_cut", "file_gone"])
def test_a_sealed_variant_whose_files_changed_is_refused_not_loaded(tmp_path, tokenizer_dir, edit):
    """A stage folder with its completion marker is loaded only while its files match it: an
    edited, truncated or half-removed variant is one line, not a model quietly served."""
    from compress.core.errors import ArtifactError
    from compress.data.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path / "run")
    tmp = store.begin("student")
    _classifier_folder(tmp, tokenizer_dir, 0)
    store.commit("student", tmp, "fp", "hf")
    folder = tmp_path / "run" / "student"
    assert folder_format(folder) == "hf"
    if edit == "config":
        config = json.loads((folder / "config.json").read_text())
        config["id2label"] = {"0": "positive", "1": "negative"}  # valid, and wrong
        (folder / "config.json").write_text(json.dumps(config))
    elif edit == "weights_cut":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (folder / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="files changed since it was written.*not loaded"):
        load_classifier(folder, threads=1)
