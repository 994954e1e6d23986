"""The onnxruntime-genai format and its export stage on a tiny random Llama: the builder's
fp32 model decodes as torch does through the HF tokenizer's ids; INT4 builds and runs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tests.tasks.causal_lm.test_export import tiny_causal

    return tiny_causal(tmp_path_factory.mktemp("tiny_llama"), "llama")


@pytest.fixture(scope="module")
def genai_fp32(tiny_llama, tmp_path_factory):
    from tests.tasks.causal_lm.test_export import run_lm_stage

    out = tmp_path_factory.mktemp("g") / "fp32"
    result = run_lm_stage("export_genai", {"precision": "fp32", "parity_prompts": 4, "parity_new_tokens": 6},
                          tiny_llama, "hf", out)
    assert result.parity["identical"] == 4 and result.parity["max_abs_diff"] < 1e-3
    return out


def test_genai_predictor_matches_torch(tiny_llama, genai_fp32):
    from compress.tasks.causal_lm import export as lm_export
    from compress.formats import causal, genai

    ref, cand = causal.load_hf(tiny_llama, "cpu", 1, {}), genai.load(genai_fp32, "cpu", 1, {})
    seqs = lm_export.tokenizer_prompts(ref.tokenizer, 3)
    ids, mask = causal.right_pad(seqs, 3)
    a, b = ref.logprobs(ids, mask), cand.logprobs(ids, mask)
    valid = mask[:, 1:].astype(bool)
    assert np.abs(a[valid] - b[valid]).max() < 1e-4
    one = causal.left_pad(seqs[:1], 3)
    assert (causal.greedy(ref, *one, 10, stop_at_eos=False) == causal.greedy(cand, *one, 10, stop_at_eos=False)).all()
    assert cand.num_params() == ref.num_params() and cand.memory_bytes() > 0


def test_genai_int4_builds_and_runs(tiny_llama, tmp_path):
    from tests.tasks.causal_lm.test_export import run_lm_stage

    result = run_lm_stage("export_genai", {"parity_prompts": 2, "parity_new_tokens": 4, "block_size": 16}, tiny_llama,
                          "hf", tmp_path / "int4")
    assert result.precision == "int4" and "int4_op_types_to_quantize=MatMul/Gather" in result.builder_options
    assert result.parity["prompts"] == 2


def test_genai_minmax_quantizes_the_builders_fp32_graph(tiny_llama, tmp_path):
    from tests.tasks.causal_lm.test_export import run_lm_stage

    result = run_lm_stage("export_genai", {"algorithm": "minmax", "lm_head_bits": 8, "block_size": 16,
                                           "parity_prompts": 2, "parity_new_tokens": 4}, tiny_llama, "hf", tmp_path / "mm")
    assert "minmax" in result.builder_options[0] and result.parity["prompts"] == 2
    assert not (tmp_path / "mm-fp32").exists() and (tmp_path / "mm" / "genai_config.json").is_file()


def test_genai_config_refuses_what_does_not_apply():
    from pydantic import ValidationError

    from compress.stages.export_genai import Config

    with pytest.raises(ValidationError, match="block_size apply to precision int4 only"):
        Config.model_validate({"precision": "fp32", "block_size": 64})
    with pytest.raises(ValidationError, match="lm_head_bits applies to algorithm minmax only"):
        Config.model_validate({"lm_head_bits": 8})
    with pytest.raises(ValidationError, match="min_identical applies to precision fp32 only"):
        Config.model_validate({"min_identical": 90})


def test_a_batch_of_several_rows_decodes_through_the_generator(tiny_llama, genai_fp32):
    """onnxruntime-genai takes appended tokens once for a batch above 1: the predictor's
    steps then come from the generator's own greedy choices. An unpadded batch (equal
    lengths) decodes as torch does, token for token."""
    from compress.tasks.causal_lm import export as lm_export
    from compress.formats import causal, genai

    ref, cand = causal.load_hf(tiny_llama, "cpu", 1, {}), genai.load(genai_fp32, "cpu", 1, {})
    seqs = lm_export.tokenizer_prompts(ref.tokenizer, 3)
    width = min(len(s) for s in seqs)
    same = [s[-width:] for s in seqs]  # equal lengths: no padding to mask
    batch = causal.left_pad(same, 3)
    ours = causal.greedy(cand, *batch, 8, stop_at_eos=False)
    assert ours.shape == (3, 8)
    assert (ours == causal.greedy(ref, *batch, 8, stop_at_eos=False)).all()


def test_genai_int8_is_minmax_blocks_and_refuses_int4_settings(tiny_llama, tmp_path):
    from pydantic import ValidationError

    from compress.stages.export_genai import Config
    from tests.tasks.causal_lm.test_export import run_lm_stage

    with pytest.raises(ValidationError, match="apply to precision int4 only"):
        Config(precision="int8", lm_head_bits=8)
    result = run_lm_stage("export_genai", {"precision": "int8", "block_size": 16, "parity_prompts": 2,
                                           "parity_new_tokens": 4}, tiny_llama, "hf", tmp_path / "i8")
    assert result.precision == "int8" and "minmax int8" in result.builder_options[0]
    assert (tmp_path / "i8" / "genai_config.json").is_file()


# --- A genai folder whose config is missing or edited (issue "Hostile inputs, third round", item 9)

@pytest.mark.parametrize("config, needle", [
    (None, "no genai_config.json"),
    ('{"model": {"decoder": {"filename": "model.onnx"}', "not valid JSON"),
    ('["model"]', "no model.decoder.filename"),
    ('{"model": {"decoder": {"filename": "../outside.onnx"}}}', "not a file of this folder"),
    ('{"model": {"decoder": {"filename": "/etc/hostname"}}}', "not a file of this folder"),
    ('{"model": {"decoder": {"filename": "missing.onnx"}}}', "not a file of this folder"),
    ('{"model": {"decoder": {"filename": "model.onnx"}, "pad_token_id": "x"}}', "model.pad_token_id"),
    ('{"model": {"decoder": {"filename": "model.onnx"}, "eos_token_id": [2, -1]}}', "model.eos_token_id"),
    ('{"model": {"decoder": {"filename": "model.onnx"}, "context_length": 0}}', "model.context_length"),
])
def test_a_missing_or_edited_genai_config_is_one_line_before_onnxruntime_genai_reads_it(tmp_path, config, needle):
    from compress.core.errors import ArtifactError
    from compress.formats import genai, load_predictor

    folder = tmp_path / "genai"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"graph")
    (tmp_path / "outside.onnx").write_bytes(b"graph")
    if config is not None:
        (folder / genai.CONFIG_FILE).write_text(config)
    with pytest.raises(ArtifactError) as exc:
        load_predictor("genai", folder, "cpu", 1, causal=True)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    if config is not None:
        assert genai.CONFIG_FILE in str(exc.value)
