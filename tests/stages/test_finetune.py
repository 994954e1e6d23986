import json

from compress.recipe.schema import validate_recipe
from compress.run.runner import run_recipe
from tests.conftest import tiny_recipe


def test_finetune_learns_and_saves_loadable_safetensors(tiny_checkpoint, tiny_data, tmp_path):
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    recipe["stages"] = recipe["stages"][:1]
    report = run_recipe(validate_recipe(recipe), tmp_path, log=lambda m: None)

    out = tmp_path / "tiny" / "baseline"
    files = {p.name for p in out.iterdir()}
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)

    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True)
    assert model.config.num_labels == 2

    result = json.loads((out / "result.json").read_text())
    assert result["train"]["examples"] == 2 * 500
    assert 0 <= result["train"]["padding_waste"] < 0.5
    row = report["rows"][0]
    assert row["id"] == "baseline" and row["accuracy"] > 90  # the synthetic task is easy
