"""onnxruntime-genai folders (genai_config.json + model.onnx[.data], written by its model
builder), run through og.Generator.

Token ids come from the Hugging Face tokenizer saved beside the model, not from og's own
tokenizer: for a model converted from GGUF (SmolLM2), tokenizer_config.json names the class
LlamaTokenizer over a GPT-2 byte-level BPE, and og's tokenizer then encodes text to -1 ids,
so its generations looked like garbage although the graph is right (fed the HF ids, its
logits match torch to 3e-5 and greedy decoding is identical).

The contract maps onto the generator as: start = a new Generator + append_tokens(prompts),
step = append_tokens(next tokens); logits are read with get_output("logits") ([B, T, V]
after a prefill, [B, 1, V] after a step). logprobs appends a whole scoring batch and reads
every position. Left padding: rows are padded with the config's pad_token_id, which
onnxruntime-genai masks out when it builds the attention mask; but here a left-padded row of a
batch does not decode as the same prompt alone does, so a batch's figures are its speed only
(every scored generation runs at batch 1, and scoring batches are right-padded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from compress.formats.causal import CausalLM

CONFIG_FILE = "genai_config.json"


class GenaiCausal(CausalLM):
    def __init__(self, path: Path, device: str, threads: int, options: dict):
        import onnxruntime_genai as og
        from transformers import AutoConfig, AutoTokenizer

        super().__init__(path)
        genai = read_config(Path(path))  # before og reads it: its own errors name no file
        self._og = og
        config = og.Config(str(path))
        config.clear_providers()  # the CPU; the builder was run with -e cpu
        # The thread count is a session option of the decoder in genai_config.json; overlay()
        # changes it for this process without touching the artifact.
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": int(threads), "inter_op_num_threads": 1}}}}))
        self.model = og.Model(config)
        self.device = "cpu"
        if device != "cpu":
            self.notes.append("onnxruntime-genai folder built for the CPU; ran on the CPU")
        self.notes.append("onnxruntime-genai: a left-padded row of a batch decodes differently from its prompt alone, "
                          "so batches above 1 give speed only (scores come from batch 1)")
        pad = genai.get("pad_token_id", genai.get("eos_token_id", 0))  # read_config checked both are ids
        self.pad = int(pad[0] if isinstance(pad, list) else pad)
        self.context_length = int(genai.get("context_length", 4096))
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        self.config = AutoConfig.from_pretrained(path, trust_remote_code=False)

    def _generator(self, batch: int, max_length: int):
        params = self._og.GeneratorParams(self.model)
        params.set_search_options(max_length=min(max_length, self.context_length), do_sample=False, batch_size=batch)
        return self._og.Generator(self.model, params)

    def _padded(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.where(mask.astype(bool), ids, self.pad).astype(np.int32)

    def logprobs(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 want: np.ndarray | None = None) -> np.ndarray:  # every column: the graph computes them all
        gen = self._generator(input_ids.shape[0], input_ids.shape[1] + 1)
        # Right padding: pad ids after a row's end only affect positions the caller masks.
        gen.append_tokens(self._padded(input_ids, np.ones_like(attention_mask)))
        x = np.asarray(gen.get_output("logits"), dtype=np.float32)[:, :-1]  # [B, T-1, V]
        top = x.max(-1, keepdims=True)
        lse = np.log(np.exp(x - top).sum(-1, keepdims=True)) + top
        return (np.take_along_axis(x, input_ids[:, 1:, None].astype(np.int64), axis=-1) - lse)[..., 0]

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        # Room for the prompt and any number of new tokens up to the model's context.
        gen = self._generator(input_ids.shape[0], self.context_length)
        gen.append_tokens(self._padded(input_ids, attention_mask))
        return np.asarray(gen.get_output("logits"), dtype=np.float32)[:, -1], _Batch(gen, input_ids.shape[0])

    def step(self, tokens: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        gen = state.gen
        if state.rows == 1:
            gen.append_tokens(np.asarray(tokens, dtype=np.int32)[:, None])
            return np.asarray(gen.get_output("logits"), dtype=np.float32)[:, -1], state
        # A batch of several rows takes appended tokens once (the prompts): each later token is
        # the generator's own greedy choice (generate_next_token: the argmax of the same logits
        # the loop reads). Its first call only selects from the prefill's logits; every later
        # call runs the model on the token selected before, then selects the next.
        if not state.selected:
            gen.generate_next_token()
            state.selected = True
        gen.generate_next_token()
        return np.asarray(gen.get_output("logits"), dtype=np.float32)[:, -1], state

    def num_params(self) -> int:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.config)
        return sum(p.numel() for p in model.parameters())

    def memory_bytes(self) -> int:
        """Bytes of the stored weights (the model files, external data included)."""
        return sum(p.stat().st_size for p in Path(self.path).iterdir() if p.name.startswith("model.onnx"))


def read_config(folder: Path) -> dict:
    """genai_config.json's `model` block, checked: a JSON object whose decoder names a graph
    file inside the folder (a plain name: never a path out of it) that is there, with
    integer token ids and a positive context length. ArtifactError naming the file for a
    missing, truncated or edited config (in a stage folder, the checksums already catch edits)."""
    from compress.core.errors import ArtifactError

    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ArtifactError(f"{folder}: no {CONFIG_FILE}; not an onnxruntime-genai folder (rebuild it with export_genai)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc.__class__.__name__}); truncated or edited: rebuild it") from exc
    model = config.get("model") if isinstance(config, dict) else None
    decoder = model.get("decoder") if isinstance(model, dict) else None
    name = decoder.get("filename") if isinstance(decoder, dict) else None
    if not isinstance(name, str):
        raise ArtifactError(f"{path}: no model.decoder.filename; not a genai config (edited?): rebuild it")
    if Path(name).name != name or name in ("", ".", "..") or not (folder / name).is_file():
        raise ArtifactError(f"{path}: model.decoder.filename '{name[:80]}' is not a file of this folder; rebuild it")

    def ids(v) -> bool:
        items = v if isinstance(v, list) else [v]
        return bool(items) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items)

    for key in ("eos_token_id", "pad_token_id"):
        if key in model and not ids(model[key]):
            raise ArtifactError(f"{path}: model.{key} is {str(model[key])[:40]}, not a token id; rebuild it")
    ctx = model.get("context_length", 4096)
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= 0:
        raise ArtifactError(f"{path}: model.context_length is {str(ctx)[:40]}, not a positive integer; rebuild it")
    return model


class _Batch:
    """A generator and how it is fed (one row: appended tokens; several: its own choices)."""

    def __init__(self, gen: Any, rows: int):
        self.gen, self.rows, self.selected = gen, rows, False


def load(path: Path, device: str, threads: int, options: dict) -> GenaiCausal:
    return GenaiCausal(Path(path), device, threads, options)
