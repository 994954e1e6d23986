import subprocess
import sys
from pathlib import Path

import pytest

from compress.core.errors import RecipeError
from compress.recipe.schema import load_recipe, validate_recipe
from tests.conftest import tiny_recipe


def error_of(recipe) -> RecipeError:
    with pytest.raises(RecipeError) as exc:
        validate_recipe(recipe, "r.yaml")
    return exc.value


def test_valid_recipe_fills_defaults(base):
    r = validate_recipe(base)
    resolved = r.resolved()
    assert resolved["stages"][1]["with"]["scheme"] == "per_channel"
    assert resolved["stages"][0]["from"] == "model"


def test_unknown_key_in_stage_settings_names_the_key_and_valid_keys(base):
    base["stages"][0]["with"]["learning_rate"] = 1e-4
    e = error_of(base)
    assert e.key == "stages[0].with.learning_rate"
    assert "unknown key" in e.message and "lr" in e.message


def test_wrong_type_names_the_key(base):
    base["stages"][0]["with"]["lr"] = "fast"
    assert error_of(base).key == "stages[0].with.lr"


def test_unknown_top_level_and_nested_keys(base):
    base["benchmark"]["thread"] = 2
    e = error_of(base)
    assert e.key == "benchmark.thread" and "threads" in e.message


def test_unknown_stage_kind_lists_the_known_ones(base):
    base["stages"][1]["uses"] = "quantise"
    e = error_of(base)
    assert e.key == "stages[1].uses" and "finetune" in e.message and "quantize_dynamic" in e.message


def test_duplicate_ids(base):
    base["stages"][1]["id"] = "baseline"
    assert "duplicate id" in error_of(base).message


def test_from_naming_no_stage(base):
    base["stages"][1]["from"] = "baseline2"
    e = error_of(base)
    assert e.key == "stages[1].from" and "names no stage" in e.message


def test_cycle(base):
    base["stages"][0]["from"] = "int8"
    base["stages"][0]["uses"] = "finetune"
    e = error_of(base)
    assert "cycle" in e.message


@pytest.mark.parametrize("bad", ["../x", "/abs", "a b", "", "x" * 65, "model"])
def test_unsafe_or_reserved_ids(base, bad):
    base["stages"][0]["id"] = bad
    base["stages"][1]["from"] = bad
    assert error_of(base).key == "stages[0].id"


def test_input_format_mismatch(base):
    # quantize_dynamic needs a classifier; the model is a bare checkpoint.
    base["stages"][1].pop("from")
    e = error_of(base)
    assert e.key == "stages[1].from" and "finetune" in e.message


def test_literal_values_are_checked(base):
    base["budget"]["objective"] = "cheapest"
    assert error_of(base).key == "budget.objective"


def test_baseline_must_exist(base):
    base["budget"]["baseline"] = "nope"
    assert error_of(base).key == "budget.baseline"


def test_schema_version(base):
    base["schema_version"] = 2
    assert error_of(base).key == "schema_version"


def test_overrides_by_index_and_by_id(base, write_recipe):
    path = write_recipe(base)
    r = load_recipe(path, ["stages[0].with.lr=0.5", "stages.int8.with.scheme=per_tensor", "budget.max_accuracy_drop=2"])
    assert r.stages[0].config.lr == 0.5
    assert r.stages[1].config.scheme == "per_tensor"
    assert r.budget.max_accuracy_drop == 2


def test_override_errors(base, write_recipe):
    path = write_recipe(base)
    with pytest.raises(RecipeError, match="no stage with that id"):
        load_recipe(path, ["stages.nope.with.lr=1"])
    with pytest.raises(RecipeError, match="KEY.PATH=VALUE"):
        load_recipe(path, ["budget"])
    with pytest.raises(RecipeError) as exc:
        load_recipe(path, ["stages[0].with.epochz=2"])
    assert exc.value.key == "stages[0].with.epochz"


def test_malformed_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nstages: [\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(p)
    assert "line" in str(exc.value)


def test_non_mapping_and_missing_file(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- 1\n- 2\n")
    with pytest.raises(RecipeError, match="mapping"):
        load_recipe(p)
    with pytest.raises(RecipeError, match="no such file"):
        load_recipe(tmp_path / "missing.yaml")


def test_default_recipe_validates_without_importing_torch():
    code = (
        "import sys; from compress.recipe.schema import load_recipe; "
        "load_recipe('recipes/bert_sentiment.yaml'); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    from tests.conftest import ROOT

    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parent.parent.parent / "recipes").glob("*.yaml")))
def test_shipped_recipes_validate_against_their_model_and_data(cli, name):
    from tests.conftest import ROOT

    code, out, err = cli("validate", ROOT / "recipes" / name)
    assert code == 0, err
    assert f"{name}: valid" in out.replace("\n", "")


@pytest.mark.parametrize("value", [-0.1, 1.5, "loose"])
def test_tie_tolerance_is_a_fraction(base, value):
    base["budget"]["tie_tolerance"] = value
    assert error_of(base).key == "budget.tie_tolerance"


# --- Length settings against the model's positions; labels against a head used as it is -----

def test_a_length_beyond_the_models_positions_names_the_key_and_the_limit(base):
    base["stages"][1]["with"]["max_length"] = 129  # tiny BERT: max_position_embeddings 128
    err = error_of(base)
    assert err.key == "stages[1].with.max_length" and "more than the model takes (128" in str(err)
    base["stages"][1]["with"]["max_length"] = 128
    base["benchmark"]["max_length"] = 1024
    err = error_of(base)
    assert err.key == "benchmark.max_length" and "set it to 128 or less" in str(err) and "\n" not in str(err)


def test_roberta_like_models_lose_the_padding_offset(tiny_data, tmp_path):
    from tests.tiny_tokenizers import tiny_model

    raw = tiny_recipe(tiny_model(tmp_path / "roberta", "roberta", max_position_embeddings=130), tiny_data)
    raw["benchmark"]["max_length"] = 129  # 130 positions, numbered from pad id 1 + 1: 128 tokens
    err = error_of(raw)
    assert err.key == "benchmark.max_length" and "(128: max_position_embeddings 130, less 2" in str(err)
    raw["benchmark"]["max_length"] = 128
    validate_recipe(raw)


def test_relative_position_models_take_any_length(tiny_data, tmp_path):
    from tests.tiny_tokenizers import tiny_model

    src = tiny_model(tmp_path / "deberta", "deberta-v2", max_position_embeddings=64, position_biased_input=False,
                     relative_attention=True)
    raw = tiny_recipe(src, tiny_data)
    raw["benchmark"]["max_length"] = 256
    validate_recipe(raw)


def test_label_names_and_num_labels_must_agree(base):
    base["data"]["label_names"] = ["negative", "positive"]
    validate_recipe(base)
    base["data"]["num_labels"] = 3
    assert "label_names has 2 names" in str(error_of(base))
    base["data"].pop("num_labels")
    for bad in (["negative"], ["a", "A"], ["0", "1"]):
        base["data"]["label_names"] = bad
        assert error_of(base).key == "data.label_names"


def test_a_head_used_as_is_with_another_label_count_fails_validation(tiny_classifier, tiny_data):
    """26.5 at validation: the classifier has 2 labels, the recipe says 3 classes."""
    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["stages"] = [{"id": "int8", "uses": "quantize_dynamic", "from": "model"}]
    raw["budget"]["baseline"] = "model"
    raw["data"]["num_labels"] = 3
    err = error_of(raw)
    assert err.key == "data.num_labels" and "classification head has 2" in str(err) and "finetune" in str(err)
    # A finetune stage fits a new head: the same data is fine there.
    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["data"]["num_labels"] = 3
    validate_recipe(raw)


def test_the_task_key_defaults_to_sequence_classification_and_names_what_is_valid(base):
    assert validate_recipe(base).task == "sequence-classification"
    assert validate_recipe(base).resolved()["task"] == "sequence-classification"
    base["task"] = "summarization"
    e = error_of(base)
    assert e.key == "task" and "sequence-classification" in e.message and "causal-lm" in e.message


def test_the_data_and_lm_blocks_belong_to_their_tasks(base):
    """A classification recipe needs `data` and takes no `lm`; a causal-LM recipe the reverse:
    each mistake is one line naming the key."""
    e = error_of({**base, "lm": {}})
    assert e.key == "lm" and "causal-lm" in e.message
    no_data = {k: v for k, v in base.items() if k != "data"}
    assert error_of(no_data).key == "data"
    e = error_of({**base, "task": "causal-lm"})
    assert e.key == "data" and "`lm`" in e.message


def test_a_stage_kind_that_does_not_take_the_recipes_task_is_refused(base, monkeypatch):
    """Every stage kind names the tasks it takes (StageKind.tasks): a recipe whose task a
    stage does not take is one line naming stages[i].uses and the `task` key."""
    import dataclasses

    from compress.core.registry import registry

    STAGES = registry()
    assert all(set(kind.tasks) <= {"sequence-classification", "causal-lm"} and kind.tasks for kind in STAGES.values())
    other = dataclasses.replace(STAGES["quantize_dynamic"], tasks=("causal-lm",))
    monkeypatch.setitem(STAGES, "quantize_dynamic", other)
    e = error_of(base)
    assert e.key == "stages[1].uses"
    assert "quantize_dynamic does not take task 'sequence-classification'" in e.message and "`task`" in e.message
    assert "\n" not in str(e)


# --- The `lm` block: bounds before work (issue "Hostile inputs, third round", items 2, 3, 8) ---

def _lm_recipe(tmp_path, positions: int = 64, **lm) -> dict:
    """A causal-LM recipe over a model folder that holds only its config.json (validation reads no more)."""
    import json

    model = tmp_path / "llama"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                   "max_position_embeddings": positions}))
    return {"schema_version": 1, "name": "lm", "task": "causal-lm", "model": {"source": str(model)},
            "lm": {"timing": {"max_prompt_tokens": 16, "new_tokens": 8}, "perplexity": {"context": 32},
                   "summarization": {"max_new_tokens": 8}, **lm},
            "stages": [{"id": "onnx", "uses": "export_onnx_lm"}], "benchmark": {"devices": ["cpu"]},
            "budget": {"baseline": "model"}}


def test_a_sound_lm_recipe_validates(tmp_path):
    validate_recipe(_lm_recipe(tmp_path))


def test_the_same_multiple_choice_set_twice_is_refused(tmp_path):
    raw = _lm_recipe(tmp_path, multiple_choice=[{"name": "piqa", "path": "p"}, {"name": "arc_easy", "path": "a"},
                                                {"name": "piqa", "path": "p2"}])
    e = error_of(raw)
    assert e.key == "lm.multiple_choice[2].name" and "named twice" in e.message and "[0]" in e.message


@pytest.mark.parametrize("where, value, key", [
    (("memory_tiers",), [{"name": "big", "gb": float("inf")}], "lm.memory_tiers[0].gb"),
    (("memory_tiers",), [{"name": "big", "gb": float("nan")}], "lm.memory_tiers[0].gb"),
    (("memory_tiers",), [{"name": "big", "gb": "1e400"}], "lm.memory_tiers[0].gb"),
    (("memory_tiers",), [{"name": "none", "gb": 0}], "lm.memory_tiers[0].gb"),
    (("timing", "batch_sizes"), [1, 0], "lm.timing.batch_sizes[1]"),
    (("timing", "prompts"), -1, "lm.timing.prompts"),
    (("perplexity", "stride"), 0, "lm.perplexity.stride"),
    (("perplexity", "max_windows"), float("inf"), "lm.perplexity.max_windows"),
    (("summarization", "max_items"), 0, "lm.summarization.max_items"),
])
def test_every_number_of_the_lm_block_is_finite_and_positive(tmp_path, where, value, key):
    raw = _lm_recipe(tmp_path)
    node = raw["lm"]
    for part in where[:-1]:
        node = node.setdefault(part, {})
    node[where[-1]] = value
    assert error_of(raw).key == key


def test_lm_lengths_against_the_models_positions_name_their_key(tmp_path):
    e = error_of(_lm_recipe(tmp_path, timing={"max_prompt_tokens": 16, "new_tokens": 64}))
    assert e.key == "lm.timing.new_tokens" and "no room for a prompt" in e.message and "64" in e.message
    e = error_of(_lm_recipe(tmp_path, timing={"max_prompt_tokens": 40, "new_tokens": 40}))
    assert e.key == "lm.timing.new_tokens" and "max_prompt_tokens 40 + new_tokens 40 = 80" in e.message
    e = error_of(_lm_recipe(tmp_path, timing={"max_prompt_tokens": 100, "new_tokens": 4}))
    assert e.key == "lm.timing.max_prompt_tokens" and "new_tokens 4" in e.message
    e = error_of(_lm_recipe(tmp_path, summarization={"max_new_tokens": 64}))
    assert e.key == "lm.summarization.max_new_tokens" and "(max_position_embeddings 64)" in e.message
    e = error_of(_lm_recipe(tmp_path, perplexity={"context": 65}))
    assert e.key == "lm.perplexity.context"
