"""Causal language models, any runtime: the contract every causal-LM loader returns, the
greedy decoding loop every variant is timed and scored with, and the torch loader.

Why a loop of our own rather than `model.generate`: the benchmark must time the first
token (prefill) apart from every later one (decode) on every runtime the same way, and
`generate` hides both behind one call, and is not offered by every runtime (an
onnxruntime-genai folder has its own generator). The loop is the plain greedy one.

Arrays are numpy: token ids int64, masks int64, logits float32. Generation batches are
left-padded (every sequence's last prompt token in the last column), so that the next
token of every row is read from the same column; scoring batches (`logprobs`) are
right-padded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from compress.formats import Predictor


class CausalLM(Predictor):
    """A loaded causal LM, ready to score and time. `config` is the model's transformers
    config (layers, heads, hidden size: the memory plan reads it)."""

    config: Any = None

    def logprobs(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 want: np.ndarray | None = None) -> np.ndarray:  # pragma: no cover
        """input_ids, attention_mask [B, T] right-padded -> [B, T-1] float32: log p(ids[b, t+1] |
        ids[b, :t+1]). Positions past a row's length hold garbage; the caller masks them.
        `want` [B, T-1] bool: the only entries the caller reads (a multiple-choice question reads
        its continuation's); a runtime may skip the others' output projection (garbage there)."""
        raise NotImplementedError

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:  # pragma: no cover
        """Prefill: prompts [B, T] left-padded -> (logits [B, V] at the last column, state)."""
        raise NotImplementedError

    def step(self, tokens: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:  # pragma: no cover
        """Decode one token per row: tokens [B] -> (logits [B, V] for the next one, state)."""
        raise NotImplementedError

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self.logprobs(batch["input_ids"], batch["attention_mask"])


def greedy(pred: CausalLM, input_ids: np.ndarray, attention_mask: np.ndarray, max_new_tokens: int,
           eos_ids: tuple[int, ...] = (), on_token: Callable[[int], None] | None = None,
           stop_at_eos: bool = True) -> np.ndarray:
    """Greedy decoding: prompts [B, T] left-padded -> new tokens [B, n] (n <= max_new_tokens;
    a row that ended is filled with its eos). `on_token(i)` is called after token i is
    chosen (i = 0 after the prefill): the benchmark's clock. stop_at_eos False: always
    max_new_tokens tokens (timing runs every row to the same length)."""
    logits, state = pred.start(input_ids, attention_mask)
    out = np.zeros((input_ids.shape[0], max_new_tokens), dtype=np.int64)
    done = np.zeros(input_ids.shape[0], dtype=bool)
    eos = np.array(eos_ids, dtype=np.int64)
    n = 0
    for i in range(max_new_tokens):
        tok = logits.argmax(-1).astype(np.int64)  # [B]
        if stop_at_eos and eos.size:
            tok = np.where(done, eos[0], tok)
            done |= np.isin(tok, eos)
        out[:, i] = tok
        n = i + 1
        if on_token is not None:
            on_token(i)
        if (stop_at_eos and eos.size and done.all()) or i == max_new_tokens - 1:
            break
        logits, state = pred.step(tok, state)
    return out[:, :n]


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> (ids, mask) [B, T] left-padded, for generation."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = s
        mask[i, width - len(s):] = 1
    return ids, mask


def right_pad(seqs: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token lists -> (ids, mask) [B, T] right-padded, for scoring."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return ids, mask


def pad_id(tokenizer) -> int:
    """Llama-family tokenizers have no pad token; the eos id pads (masked out anyway)."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


class TorchCausal(CausalLM):
    """A transformers causal LM run with torch (fp32, or a torch-quantized copy of one)."""

    def __init__(self, path: Path, model, tokenizer, device: str = "cpu"):
        import torch

        super().__init__(path)
        self._torch = torch
        self.model = model.eval().to(device) if device != "cpu" else model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        self.device = device
        import inspect

        takes = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._keep_last = {"logits_to_keep": 1} if takes else {}

    def _t(self, a: np.ndarray):
        return self._torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def logprobs(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 want: np.ndarray | None = None) -> np.ndarray:
        torch = self._torch
        B, T = input_ids.shape
        cols = np.arange(T - 1) if want is None or not self._keep_last else np.flatnonzero(want.any(0))  # [K]
        keep = {"logits_to_keep": self._t(cols)} if want is not None and self._keep_last else {}
        with torch.inference_mode():
            # logits_to_keep as indices: the output projection runs on the K columns some row
            # reads, not all T ([B, K, V]; Gemma-3's 262,144-column head is most of the model).
            logits = self.model(input_ids=self._t(input_ids), attention_mask=self._t(attention_mask),
                                use_cache=False, **keep).logits  # [B, T or K, V]
            if not keep:
                logits = logits[:, :-1]
            lp = torch.log_softmax(logits.float(), dim=-1)  # [B, K, V]
            nxt = self._t(input_ids[:, 1:][:, cols]).unsqueeze(-1)  # [B, K, 1]
            out = np.zeros((B, max(T - 1, 0)), dtype=np.float32)
            out[:, cols] = lp.gather(-1, nxt).squeeze(-1).cpu().numpy()
            return out

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        torch = self._torch
        mask = self._t(attention_mask)
        # Left padding: a row's positions count from its first real token.
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            # logits_to_keep=1: only the last column is read, so no [B, T, V] logits are built
            # (at V = 49,152 a batch of 16 prompts of 256 tokens would take 0.8 GB).
            out = self.model(input_ids=self._t(input_ids), attention_mask=mask, position_ids=pos, use_cache=True,
                             **self._keep_last)
        state = (out.past_key_values, mask, pos[:, -1:])
        return out.logits[:, -1].float().cpu().numpy(), state

    def step(self, tokens: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        torch = self._torch
        past, mask, last = state
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)  # [B, T+1]
        pos = last + 1
        with torch.inference_mode():
            out = self.model(input_ids=self._t(tokens[:, None]), attention_mask=mask, position_ids=pos,
                             past_key_values=past, use_cache=True)
        return out.logits[:, -1].float().cpu().numpy(), (out.past_key_values, mask, pos)

    def sync(self) -> None:
        if self.device == "cuda":
            self._torch.cuda.synchronize()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def memory_bytes(self) -> int:
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)

    def peak_memory_bytes(self) -> int | None:
        return int(self._torch.cuda.max_memory_allocated()) if self.device == "cuda" else None


def load_hf(path: Path, device: str, threads: int, options: dict) -> TorchCausal:
    """An `hf` folder holding a causal LM (safetensors, fp32)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32", trust_remote_code=False, use_safetensors=True)
    return TorchCausal(path, model, AutoTokenizer.from_pretrained(path, trust_remote_code=False), device)
