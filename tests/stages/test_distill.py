import re

import numpy as np
import pytest
import torch

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from tests.conftest import run_stage, tiny_recipe

torch.set_num_threads(1)

FAST = {"epochs": 1, "lr": 1e-3, "batch_size": 32, "max_length": 32}


def test_student_keeps_requested_layers_initialised_from_the_teacher(tiny_classifier_4l):
    from transformers import AutoModelForSequenceClassification

    from compress.techniques.distillation import copy_layers, default_layers

    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_4l)
    assert default_layers(4) == [1, 3] and default_layers(6) == [1, 3, 5] and default_layers(5) == [0, 2, 4]
    student = copy_layers(teacher, [1, 3])
    assert student.config.num_hidden_layers == 2 and len(student.bert.encoder.layer) == 2
    t, s = teacher.state_dict(), student.state_dict()
    source_layer = {"0": "1", "1": "3"}
    for key, value in s.items():
        src = re.sub(r"encoder\.layer\.(\d+)\.", lambda m: f"encoder.layer.{source_layer[m.group(1)]}.", key)
        assert torch.equal(value, t[src]), key
    # Different teacher layers really are different weights: the check above can fail.
    assert not torch.equal(s["bert.encoder.layer.0.attention.self.query.weight"],
                           t["bert.encoder.layer.0.attention.self.query.weight"])
    assert torch.equal(s["classifier.weight"], t["classifier.weight"])
    assert torch.equal(s["bert.embeddings.word_embeddings.weight"], t["bert.embeddings.word_embeddings.weight"])


def test_distill_loss_is_the_published_formula():
    from compress.techniques.distillation import DistillSettings, distill_loss

    class Fixed(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, **_):
            return type("Out", (), {"logits": self.logits})()

    s, t = torch.randn(5, 3), torch.randn(5, 3)
    labels = torch.tensor([0, 1, 2, 1, 0])
    T, alpha = 3.0, 0.3
    loss = distill_loss(t, DistillSettings(temperature=T, alpha=alpha))(
        Fixed(s), {"idx": torch.arange(5), "labels": labels, "attention_mask": torch.ones(5, 4)}
    )
    p_t = torch.softmax(t / T, -1)
    kl = (p_t * (p_t.log() - torch.log_softmax(s / T, -1))).sum(-1).mean()
    expected = alpha * kl * T * T + (1 - alpha) * torch.nn.functional.cross_entropy(s, labels)
    assert torch.allclose(loss, expected, atol=1e-6)


def test_hidden_state_term_is_zero_for_matching_layers_and_the_masked_mean_cosine_otherwise(tiny_classifier_4l):
    from transformers import AutoModelForSequenceClassification

    from compress.techniques.distillation import DistillSettings, copy_layers, distill_loss

    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_4l).eval()
    student = copy_layers(teacher, [1, 3]).eval()
    ids = torch.randint(5, 1000, (3, 7))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, 4:] = 0  # padding must not count
    batch = {"input_ids": ids, "attention_mask": mask, "idx": torch.arange(3), "labels": torch.tensor([0, 1, 0])}
    logits = torch.randn(3, 2)
    plain = distill_loss(logits, DistillSettings())(student, batch)
    with_hidden = DistillSettings(hidden_weight=2.0)
    # A student with all the teacher's layers has the teacher's hidden states: the term is 0.
    full = copy_layers(teacher, [0, 1, 2, 3]).eval()
    same = distill_loss(logits, with_hidden, teacher, [(1, 1), (3, 3)])(full, batch)
    assert torch.allclose(same, distill_loss(logits, DistillSettings())(full, batch), atol=1e-6)
    # The 2-layer student: weight * mean over pairs of the masked mean of (1 - cos) [B, T].
    other = distill_loss(logits, with_hidden, teacher, [(0, 1), (1, 3)])(student, batch)
    with torch.no_grad():
        hs = student(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        ht = teacher(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    m = mask.float()
    terms = [((1 - torch.cosine_similarity(hs[s + 1], ht[t + 1], dim=-1)) * m).sum() / m.sum() for s, t in [(0, 1), (1, 3)]]
    extra = float(other - plain)
    assert extra > 0
    assert extra == pytest.approx(2.0 * float(sum(terms)) / 2, rel=1e-3)


def test_teacher_bf16_runs_the_live_teacher_in_bfloat16_and_keeps_the_loss_close(tiny_classifier_4l):
    from transformers import AutoModelForSequenceClassification

    from compress.techniques.distillation import DistillSettings, copy_layers, distill_loss, layer_list

    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_4l).eval()
    student = copy_layers(teacher, [1, 3]).eval()
    dtypes = []
    # A matmul's output shows the arithmetic (layer norms, hence layer outputs, stay fp32 under autocast).
    first_linear = next(m for m in layer_list(teacher)[0].modules() if isinstance(m, torch.nn.Linear))
    first_linear.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    batch = {"input_ids": torch.randint(5, 1000, (4, 9)), "attention_mask": torch.ones(4, 9, dtype=torch.long),
             "idx": torch.arange(4), "labels": torch.tensor([0, 1, 0, 1])}
    logits = torch.randn(4, 2)
    settings = DistillSettings(hidden_weight=1.0)
    fp32 = distill_loss(logits, settings, teacher, [(0, 1), (1, 3)])(student, batch)
    bf16 = distill_loss(logits, settings, teacher, [(0, 1), (1, 3)], teacher_bf16=True)(student, batch)
    assert dtypes == [torch.float32, torch.bfloat16]
    assert bf16.dtype == torch.float32 and float(bf16) != float(fp32)
    assert float(bf16) == pytest.approx(float(fp32), rel=0.02)


@pytest.mark.parametrize(("settings", "native", "expected"), [
    ({"hidden_weight": 0.0}, True, None),  # no live teacher
    ({"hidden_weight": 1.0}, True, "bf16"),
    ({"hidden_weight": 1.0}, False, "fp32"),
    ({"hidden_weight": 1.0, "teacher_precision": "fp32"}, True, "fp32"),
    ({"hidden_weight": 1.0, "teacher_precision": "bf16"}, False, "bf16"),
])
def test_teacher_precision_auto_follows_native_bfloat16(monkeypatch, settings, native, expected):
    import compress.techniques.distillation
    from compress.techniques.distillation import DistillSettings, teacher_precision

    monkeypatch.setattr(compress.techniques.distillation, "bf16_native", lambda device: native)
    assert teacher_precision(DistillSettings(**settings), "cpu") == expected


def test_teacher_logits_are_cached_equal_a_fresh_pass_and_reused(tiny_classifier_4l, tiny_data, tmp_path):
    from transformers import AutoTokenizer

    from compress.tasks.classification.data import Data
    from compress.formats import hf
    from compress.techniques.predict import encode, predict_logits

    cache = tmp_path / "cache"
    fp32 = {**FAST, "teacher_precision": "fp32"}  # compared with an fp32 pass below
    first = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "a", "distill", fp32, cache_root=cache)
    assert first.teacher_cache["reused"] is False and first.teacher_cache["precision"] == "fp32"
    assert first.student_layers == 2 and first.initialised_from == [1, 3] and first.params < first.params_teacher
    cached = np.load(tmp_path / "a" / "teacher_logits.npy")

    raw = tiny_recipe(tiny_classifier_4l, tiny_data)
    raw["data"]["max_train_examples"] = 200
    recipe = validate_recipe(raw)
    data = Data(recipe.data, recipe.base_dir)
    tok = AutoTokenizer.from_pretrained(tiny_classifier_4l)
    fresh = predict_logits(hf.load_model(tiny_classifier_4l), tok, encode(tok, data.train, 32), batch_size=7)
    assert cached.shape == (200, 2)
    np.testing.assert_allclose(cached, fresh, atol=1e-5)

    # Other student settings: same teacher, data and max_length -> the cache is reused.
    second = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "b", "distill",
                       {**fp32, "lr": 5e-4, "layers": [3], "alpha": 0.9}, cache_root=cache)
    assert second.teacher_cache["reused"] is True and second.teacher_cache["key"] == first.teacher_cache["key"]
    assert second.student_layers == 1
    np.testing.assert_array_equal(np.load(tmp_path / "b" / "teacher_logits.npy"), cached)
    # Another max_length is another key.
    third = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "c", "distill", {**fp32, "max_length": 16}, cache_root=cache)
    assert third.teacher_cache["reused"] is False
    # A bf16 teacher pass is another key, and its fp32-kept logits stay close to the fp32 pass's.
    bf16 = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "d", "distill", {**FAST, "teacher_precision": "bf16"},
                     cache_root=cache)
    assert bf16.teacher_cache["reused"] is False and bf16.teacher_cache["precision"] == "bf16"
    rounded = np.load(tmp_path / "d" / "teacher_logits.npy")
    assert rounded.dtype == np.float32 and not np.array_equal(rounded, cached)
    np.testing.assert_allclose(rounded, cached, atol=0.1)


def test_augmented_copies_of_whole_sentences_join_the_training_examples(tiny_classifier_4l, tiny_data, tmp_path):
    from compress.tasks.classification.data import Data

    cache = tmp_path / "cache"
    plain = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "a", "distill", FAST, cache_root=cache)
    aug = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "b", "distill", {**FAST, "augment": {"copies": 2}},
                    cache_root=cache)
    raw = tiny_recipe(tiny_classifier_4l, tiny_data)
    raw["data"]["max_train_examples"] = 200
    recipe = validate_recipe(raw)
    data = Data(recipe.data, recipe.base_dir)
    sentences = sum(" ".join(t.split()) in data.sentences for t in data.train.texts)
    assert sentences > 0
    assert aug.train_examples == plain.train_examples + 2 * sentences
    assert aug.teacher_cache["key"] != plain.teacher_cache["key"]  # the copies are other examples
    # The teacher's accuracy is on the real examples only, so both runs report the same figure.
    assert aug.teacher_train_accuracy == plain.teacher_train_accuracy


def test_hidden_state_loss_trains_and_saves_a_loadable_student(tiny_classifier_4l, tiny_data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    result = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "out", "distill",
                       {**FAST, "layers": [1, 3], "hidden_weight": 1.0})
    assert np.isfinite(result.train["final_loss"])
    assert result.teacher_precision in ("fp32", "bf16")
    student = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", use_safetensors=True)
    assert student.config.num_hidden_layers == 2


def _recipe(model, data, settings):
    raw = tiny_recipe(model, data)
    raw["stages"] = [{"id": "student", "uses": "distill", "with": settings}]
    raw["budget"] = {"baseline": "student"}
    return raw


@pytest.mark.parametrize("settings, key", [
    ({"augment": {"copies": 2, "mask": 0.8, "swap": 0.8}}, "stages[0].with.augment"),
    ({"augment": {"copies": 2, "typo": 1}}, "stages[0].with.augment.typo"),
    ({"layers": [0, 0]}, "stages[0].with.layers"),
    ({"alpha": 1.5}, "stages[0].with.alpha"),
    ({"temperature": 0}, "stages[0].with.temperature"),
    ({"temprature": 2.0}, "stages[0].with.temprature"),
    ({"layers": [0, 7]}, "stages[0].with.layers"),  # the teacher (the recipe's model) has 4 layers
    ({"train_examples": "everything"}, "stages[0].with.train_examples"),
    ({"train_examples": 0}, "stages[0].with.train_examples"),
])
def test_bad_settings_fail_validation_naming_the_key(tiny_classifier_4l, tiny_data, settings, key):
    with pytest.raises(RecipeError) as err:
        validate_recipe(_recipe(tiny_classifier_4l, tiny_data, settings))
    assert err.value.key == key


def test_layers_and_student_are_exclusive(tiny_classifier_4l, tiny_data):
    with pytest.raises(RecipeError, match="not both"):
        validate_recipe(_recipe(tiny_classifier_4l, tiny_data, {"layers": [0], "student": "some/model"}))


def test_a_separate_student_model_is_distilled(tiny_classifier_4l, tiny_classifier, tiny_data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    result = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "out", "distill",
                       {**FAST, "student": str(tiny_classifier), "hidden_weight": 1.0})
    assert result.initialised_from == str(tiny_classifier) and result.student_layers == 2
    student = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", use_safetensors=True)
    before = AutoModelForSequenceClassification.from_pretrained(tiny_classifier)
    assert not torch.equal(student.classifier.weight, before.classifier.weight)  # it trained


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_embeddings_keeps_the_word_embeddings_and_trains_the_rest(tiny_classifier_4l, tiny_data, tmp_path, freeze):
    from transformers import AutoModelForSequenceClassification

    run_stage(tiny_classifier_4l, tiny_data, tmp_path / "out", "distill",
              {**FAST, "layers": [1, 3], "freeze_embeddings": freeze})
    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_4l, use_safetensors=True)
    student = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", use_safetensors=True)
    emb_same = torch.equal(teacher.get_input_embeddings().weight, student.get_input_embeddings().weight)
    assert emb_same is freeze
    # The layers train either way (student layer 1 started as teacher layer 3).
    t = teacher.bert.encoder.layer[3].output.dense.weight
    s = student.bert.encoder.layer[1].output.dense.weight
    assert not torch.equal(t, s)


def test_train_examples_distils_on_more_of_the_split_outside_the_calibration_slice(
        tiny_classifier_4l, tiny_data, tmp_path, monkeypatch):
    from compress.tasks.classification.data import Data

    monkeypatch.setattr(Data, "CALIBRATION_RESERVE", 100)  # tiny_data: 600 training rows, subset 200
    cache = tmp_path / "cache"
    base = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "a", "distill", {**FAST, "layers": [3]}, cache_root=cache)
    assert base.train_examples == 200
    more = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "b", "distill",
                     {**FAST, "layers": [3], "train_examples": 300}, cache_root=cache)
    assert more.train_examples == 300 and more.teacher_cache["examples"] == 300
    assert more.teacher_cache["reused"] is False  # other examples, other cached logits
    every = run_stage(tiny_classifier_4l, tiny_data, tmp_path / "c", "distill",
                      {**FAST, "layers": [3], "train_examples": "all"}, cache_root=cache)
    assert every.train_examples == 500  # 600 minus the 100 kept for calibration
