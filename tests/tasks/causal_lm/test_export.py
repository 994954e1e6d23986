"""compress.tasks.causal_lm.export on tiny random causal LMs built from configs (Llama, and Qwen2 as a
second family): export with a KV cache, greedy parity against torch, INT4 and INT8."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

WORDS = ("the a an of to and in is was it that for on with as by at from this be are were "
         "cat dog sea sun moon tree house river city book music food water time day night year "
         "good bad new old big small long short red blue green happy sad fast slow").split()


def causal_tokenizer():
    """A WordLevel tokenizer over a small English vocabulary, with bos/eos/pad and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(WORDS)) + list("?!.,:"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<s> {{ m['content'] }} </s>{% endfor %}"
                          "{% if add_generation_prompt %} <s>{% endif %}")
    return fast


def tiny_causal(folder: Path, family: str = "llama", seed: int = 0) -> Path:
    """A random tiny causal LM of `family` (llama: tied embeddings; qwen2: untied) with the
    tokenizer above, saved in `folder`."""
    import torch
    import transformers

    tok = causal_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, pad_token_id=3)
    if family == "llama":
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, **common)
        cls = transformers.LlamaForCausalLM
    else:
        cfg = transformers.Qwen2Config(tie_word_embeddings=False, **common)
        cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():  # larger weights than the init's 0.02: logits with clear winners
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_lm(request, tmp_path_factory) -> Path:
    return tiny_causal(tmp_path_factory.mktemp(f"tiny_{request.param}"), request.param)


@pytest.fixture(scope="session")
def tiny_lm_onnx(tiny_lm, tmp_path_factory) -> Path:
    from compress.tasks.causal_lm import export as lm_export

    out = tmp_path_factory.mktemp("onnx")
    lm_export.export(tiny_lm, out)
    return out


def _loaders(hf_dir, onnx_dir):
    from compress.formats import causal, causal_onnx

    return causal.load_hf(hf_dir, "cpu", 1, {}), causal_onnx.load(onnx_dir, "cpu", 1, {})


def test_export_writes_kv_cache_graph_and_side_files(tiny_lm, tiny_lm_onnx):
    import onnx

    files = {p.name for p in tiny_lm_onnx.iterdir()}
    assert {"model.onnx", "config.json", "generation_config.json", "tokenizer.json"} <= files
    assert not any(f.endswith(".safetensors") for f in files)
    graph = onnx.load(str(tiny_lm_onnx / "model.onnx"), load_external_data=False).graph
    names = [i.name for i in graph.input]
    assert "past_key_values.1.value" in names and "present.1.value" in [o.name for o in graph.output]


def test_parity_identical_and_max_diff_small(tiny_lm, tiny_lm_onnx):
    from compress.tasks.causal_lm import export as lm_export

    ref, cand = _loaders(tiny_lm, tiny_lm_onnx)
    prompts = lm_export.tokenizer_prompts(ref.tokenizer, 6)
    assert len({tuple(p) for p in prompts}) == 6
    result = lm_export.parity(ref, cand, prompts, new_tokens=8, batch_size=3)
    assert result["identical"] == 6 and result["token_agreement"] == 100.0 and result["first_mismatch"] is None
    assert 0 < result["max_abs_diff"] < 1e-3


def test_parity_reports_a_drifting_candidate(tiny_lm, tiny_lm_onnx):
    from compress.tasks.causal_lm import export as lm_export

    ref, cand = _loaders(tiny_lm, tiny_lm_onnx)
    start = cand.start

    def shifted(ids, mask):  # a candidate whose first token is always another one
        logits, state = start(ids, mask)
        logits = logits.copy()
        logits[:, 5] = logits.max(-1) + 1.0
        return logits, state

    cand.start = shifted
    prompts = lm_export.tokenizer_prompts(ref.tokenizer, 3)
    result = lm_export.parity(ref, cand, prompts, new_tokens=4)
    assert result["identical"] < 3 and result["first_mismatch"] is not None
    assert result["max_abs_diff"] > 1.0


def test_untie_lm_head_makes_a_constant_weight(tiny_lm, tiny_lm_onnx):
    import onnx

    from compress.tasks.causal_lm import export as lm_export

    model = onnx.load(str(tiny_lm_onnx / "model.onnx"))
    before = [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in {t.name for t in model.graph.initializer}]
    untied = lm_export.untie_lm_head(model)
    tied = "llama" in tiny_lm.name
    assert bool(untied) == tied == bool(before)
    inits = {t.name for t in model.graph.initializer}
    head = [n for n in model.graph.node if n.op_type == "MatMul" and n.output[0] == "logits"]
    assert head and head[0].input[1] in inits


@pytest.mark.parametrize("algorithm", ["rtn", "hqq", "minmax"])
def test_int4_quantizes_every_matmul_embedding_and_head(tiny_lm, tiny_lm_onnx, tmp_path, algorithm):
    from compress.tasks.causal_lm import export as lm_export
    from compress.formats import causal

    out = tmp_path / "int4"
    rec = lm_export.quantize_int4(tiny_lm_onnx, out, algorithm=algorithm, block_size=32)
    ops = rec["operators"]
    # Every MatMul with a constant weight: q k v o gate up down per layer, and the head (the
    # MatMuls left are attention's, activation by activation).
    assert ops["MatMulNBits"] == 2 * 7 + 1, ops
    assert ops["GatherBlockQuantized"] == 1
    assert rec["size_bytes"]["output"] < rec["size_bytes"]["input"] / 2  # the graph itself is most of a tiny model
    assert {"tokenizer.json", "config.json", "generation_config.json"} <= {p.name for p in out.iterdir()}
    ref, cand = _loaders(tiny_lm, out)
    ids, mask = causal.right_pad(lm_export.tokenizer_prompts(ref.tokenizer, 4), 3)
    a, b = ref.logprobs(ids, mask), cand.logprobs(ids, mask)
    valid = mask[:, 1:].astype(bool)
    assert np.isfinite(b[valid]).all()
    # Random weights quantize badly; still the mean log-likelihood stays in the same range.
    assert abs(a[valid].mean() - b[valid].mean()) < 0.5 * abs(a[valid].mean())
    assert cand.num_params() == ref.num_params()


def test_int4_without_embeddings_and_head_keeps_them(tiny_lm, tiny_lm_onnx, tmp_path):
    from compress.tasks.causal_lm import export as lm_export

    rec = lm_export.quantize_int4(tiny_lm_onnx, tmp_path / "q", embeddings=False, lm_head=False)
    assert rec["operators"]["MatMulNBits"] == 14 and "GatherBlockQuantized" not in rec["operators"]
    assert rec["untied"] == []


def test_minmax_is_exact_on_a_block_grid(tmp_path):
    # Weights that already sit on a 4-bit grid per 32-weight block with a float minimum (as
    # a GGUF Q4_1 file stores them) come back exactly; rtn's integer zero point cannot.
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from compress.tasks.causal_lm import export as lm_export

    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, size=(64, 2, 32))  # [N, K/32, 32]
    q[..., 0], q[..., 1] = 0, 15  # every block spans its full range
    w = (q * rng.uniform(0.01, 0.1, (64, 2, 1)) + rng.uniform(-0.5, 0.0, (64, 2, 1))).reshape(64, 64).T  # [K, N]
    w = w.astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              [numpy_helper.from_array(w, "w")])
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(src / "model.onnx"))
    import onnxruntime as ort

    x = rng.normal(size=(1, 64)).astype(np.float32)
    errors = {}
    for algorithm in ("minmax", "rtn"):
        lm_export.quantize_int4(src, tmp_path / algorithm, algorithm=algorithm, symmetric=False, accuracy_level=0,
                                embeddings=False, lm_head=False)
        sess = ort.InferenceSession(str(tmp_path / algorithm / "model.onnx"), providers=["CPUExecutionProvider"])
        errors[algorithm] = float(np.abs(sess.run(None, {"x": x})[0] - x @ w).max())
    # minmax: only the fp16 rounding of the block offsets (see _fold_float_zero_points)
    assert errors["minmax"] < 1e-2 and errors["minmax"] < errors["rtn"] / 20, errors


def test_weight_only_head_bits_and_int8(tiny_lm, tiny_lm_onnx, tmp_path):
    import onnx

    from compress.tasks.causal_lm import export as lm_export

    def head_bits(folder):
        graph = onnx.load(str(folder / "model.onnx")).graph
        node = next(n for n in graph.node if "logits" in n.output)
        assert node.op_type == "MatMulNBits"
        return {a.name: a.i for a in node.attribute}["bits"]

    rec = lm_export.quantize_int4(tiny_lm_onnx, tmp_path / "h8", lm_head_bits=8, algorithm="hqq")
    assert rec["operators"]["MatMulNBits"] == 15 and head_bits(tmp_path / "h8") == 8
    rec = lm_export.quantize_int4(tiny_lm_onnx, tmp_path / "w8", bits=8, embeddings=False)
    assert rec["operators"]["MatMulNBits"] == 15 and head_bits(tmp_path / "w8") == 8
    a, b = _loaders(tiny_lm, tmp_path / "w8")
    from compress.formats import causal

    ids, mask = causal.right_pad(lm_export.tokenizer_prompts(a.tokenizer, 4), 3)
    valid = mask[:, 1:].astype(bool)
    assert np.abs(a.logprobs(ids, mask)[valid] - b.logprobs(ids, mask)[valid]).mean() < 0.05


def test_int8_dynamic_close_to_torch(tiny_lm, tiny_lm_onnx, tmp_path):
    from compress.tasks.causal_lm import export as lm_export
    from compress.formats import causal

    rec = lm_export.quantize_int8(tiny_lm_onnx, tmp_path / "int8", per_channel=True)
    assert rec["operators"]["MatMulInteger"] == 15
    ref, cand = _loaders(tiny_lm, tmp_path / "int8")
    ids, mask = causal.right_pad(lm_export.tokenizer_prompts(ref.tokenizer, 4), 3)
    a, b = ref.logprobs(ids, mask), cand.logprobs(ids, mask)
    valid = mask[:, 1:].astype(bool)
    assert np.abs(a[valid] - b[valid]).mean() < 0.1


# --- the stages (run on their module's KIND: no recipe, no runner)


def run_lm_stage(module: str, settings: dict, src: Path, fmt: str, out: Path, data=None):
    import importlib
    import shutil

    from compress.data.artifacts import Artifact
    from compress.data.context import StageContext

    kind = importlib.import_module(f"compress.stages.{module}").KIND
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    logs: list[str] = []
    ctx = StageContext(stage_id=module, config=kind.config.model_validate(settings), input=Artifact("input", src, fmt, "fp"),
                       out=out, recipe=None, _data=(lambda: data) if data is not None else None, log=logs.append,
                       threads=1)
    result = kind.run(ctx)
    assert result.format == kind.produces and logs
    return kind.result.model_validate(result.model_dump())


def test_export_stage_passes_parity(tiny_lm, tmp_path):
    result = run_lm_stage("export_onnx_lm", {"parity_prompts": 6, "parity_new_tokens": 6}, tiny_lm, "hf", tmp_path / "o")
    assert result.parity["identical"] == 6 and result.parity["max_abs_diff"] < 1e-3
    assert "past_key_values.0.key" in result.inputs and result.opset >= 14
    assert (tmp_path / "o" / "model.onnx").is_file()


def test_export_stage_fails_in_one_line_on_drift(tiny_lm, tmp_path, monkeypatch):
    from compress.core.errors import StageError
    from compress.formats import causal_onnx

    original = causal_onnx.OnnxCausal.step

    def drifting(self, tokens, state):  # every decode step prefers token 4
        logits, state = original(self, tokens, state)
        logits = logits.copy()
        logits[:, 4] += 100.0
        return logits, state

    monkeypatch.setattr(causal_onnx.OnnxCausal, "step", drifting)
    with pytest.raises(StageError) as exc:
        run_lm_stage("export_onnx_lm", {"parity_prompts": 3, "parity_new_tokens": 4}, tiny_lm, "hf", tmp_path / "o")
    msg = str(exc.value)
    assert "\n" not in msg and "0/3 prompts decode identically" in msg and "min_identical" in msg


def test_export_stage_tolerance_limits_the_logit_difference(tiny_lm, tmp_path):
    from compress.core.errors import StageError

    with pytest.raises(StageError, match=r"tolerance 0\)"):
        run_lm_stage("export_onnx_lm", {"parity_prompts": 2, "parity_new_tokens": 2, "tolerance": 0}, tiny_lm, "hf",
                     tmp_path / "o")


def test_export_stage_data_prompts(tiny_lm, tmp_path):
    from compress.core.errors import StageError

    class Prompts:
        def prompts(self, n):
            return ["the cat and the dog", "a big red house"][:n]

    result = run_lm_stage("export_onnx_lm", {"parity_prompts": 2, "parity_new_tokens": 3, "prompt_source": "data"},
                          tiny_lm, "hf", tmp_path / "o", data=Prompts())
    assert result.parity["prompts"] == 2 and result.parity["identical"] == 2
    with pytest.raises(StageError, match="prompt_source: tokenizer"):
        run_lm_stage("export_onnx_lm", {"parity_prompts": 2, "prompt_source": "data"}, tiny_lm, "hf", tmp_path / "p",
                     data=object())


@pytest.mark.parametrize("settings", [{"bits": 4}, {"bits": 4, "algorithm": "hqq", "block_size": 16, "lm_head_bits": 8},
                                      {"bits": 8}, {"bits": 8, "scheme": "dynamic", "per_channel": False}])
def test_quantize_stage(tiny_lm_onnx, tmp_path, settings):
    result = run_lm_stage("quantize_onnx_lm", {**settings, "parity_prompts": 3, "parity_new_tokens": 4}, tiny_lm_onnx,
                          "onnx", tmp_path / "q")
    assert result.bits == settings["bits"]
    dynamic = settings.get("scheme") == "dynamic"
    assert result.operators.get("MatMulInteger" if dynamic else "MatMulNBits", 0) == 15
    assert result.size_bytes["output"] < result.size_bytes["input"]
    assert result.parity["prompts"] == 3 and 0 <= result.parity["token_agreement"] <= 100


@pytest.mark.parametrize("settings, words", [
    ({"bits": 8, "scheme": "dynamic", "block_size": 64}, "block_size apply to scheme weight_only only"),
    ({"bits": 8, "scheme": "dynamic", "algorithm": "hqq", "accuracy_level": 0},
     "algorithm, accuracy_level apply to scheme weight_only only"),
    ({"scheme": "dynamic"}, "scheme dynamic is INT8"),
    ({"per_channel": False}, "per_channel applies to scheme dynamic only"),
    ({"lm_head": False, "lm_head_bits": 8}, "lm_head_bits applies when lm_head is quantized"),
    ({"algorithm": "hqq", "symmetric": False}, "symmetric applies to algorithm rtn only"),
    ({"algorithm": "minmax", "symmetric": False}, "symmetric applies to algorithm rtn only"),
    ({"block_size": 48}, "block_size"),
    ({"bits": 2}, "bits"),
    ({"bogus": 1}, "bogus"),
])
def test_quantize_config_refuses_what_does_not_apply(settings, words):
    from pydantic import ValidationError

    from compress.stages.quantize_onnx_lm import Config

    with pytest.raises(ValidationError, match=words):
        Config.model_validate(settings)
    assert Config.model_validate({"bits": 8, "scheme": "dynamic"}).per_channel and Config.model_validate({}).bits == 4
    # A dumped config holds every key, defaults included: it reads back.
    for given in ({"bits": 8, "scheme": "dynamic"}, {"algorithm": "hqq"}, {"lm_head": False}):
        cfg = Config.model_validate(given)
        assert Config.model_validate(cfg.model_dump()) == cfg


def test_quantize_stage_refuses_a_quantized_input():
    from compress.stages.quantize_onnx_lm import KIND

    assert "already quantized" in KIND.check_input([("quantize_onnx_lm", None), ("export_onnx_lm", None)])
    assert KIND.check_input([("export_onnx_lm", None), ("model", None)]) is None
    assert KIND.tasks == ("causal-lm",)
