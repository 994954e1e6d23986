"""Tiny causal LMs for tests: a byte-level BPE tokenizer with a chat template, built in code,
random Llama / GPT-2 / Qwen2 models of it, and stub predictors whose log-probabilities and
timings the test chooses."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from compress.formats.causal import CausalLM

SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|user|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TEXT = ["the cat sat on the mat", "a dog ran in the park", "Question: which is heavier?\nAnswer: iron",
        "Summarize this dialogue:\nAnn: hi Bob\nBob: hello Ann, see you at noon",
        "Ann will meet Bob at noon", "water boils at one hundred degrees", "plants need light to grow",
        " = Robert Boulter = \n\n Robert Boulter is an English film actor"]


def causal_tokenizer(vocab_size: int = 300):
    """GPT-2 style byte-level BPE adding BOS (as the SmolLM2 GGUF tokenizer does), eos `</s>`, no pad."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT * 5, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_causal(folder: Path, family: str = "llama") -> Path:
    """A random tiny causal LM of `family` (llama, gpt2, qwen2) with the tokenizer, saved in `folder`."""
    import torch
    import transformers

    tok = causal_tokenizer()
    torch.manual_seed(0)
    common = dict(vocab_size=len(tok), bos_token_id=1, eos_token_id=2)
    if family == "gpt2":
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, **common)
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        cls = transformers.LlamaConfig if family == "llama" else transformers.Qwen2Config
        cfg = cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, **common)
        model = (transformers.LlamaForCausalLM if family == "llama" else transformers.Qwen2ForCausalLM)(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


class CharTokenizer:
    """One token per character (id = code point + 10), BOS 1 added by default, eos 2."""

    bos_token_id, eos_token_id, pad_token_id, chat_template = 1, 2, None, None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) + 10 for c in text]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i - 10) for i in ids if i >= 10)

    def __len__(self) -> int:
        return 300


class Config:
    vocab_size = 300
    max_position_embeddings = 64
    eos_token_id = 2
    num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size = 2, 4, 2, 16


class StubLM(CausalLM):
    """log p(next token) = `fn(token ids [B, T-1])`; generation emits `script` then eos, taking
    `prefill_s` for the prefill and `step_s` per decode step."""

    def __init__(self, fn=None, script=(50, 51, 52), prefill_s: float = 0.0, step_s: float = 0.0):
        super().__init__(Path("."))
        self.tokenizer, self.config = CharTokenizer(), Config()
        self.fn = fn or (lambda nxt: np.full(nxt.shape, -np.log(300.0)))
        self.script, self.prefill_s, self.step_s = list(script), prefill_s, step_s
        self.calls: list[tuple[int, int]] = []  # (rows, width) of each logprobs call

    def logprobs(self, input_ids, attention_mask, want=None):
        self.calls.append(input_ids.shape)
        return np.asarray(self.fn(input_ids[:, 1:]), dtype=np.float32)

    def _logits(self, pos: int, rows: int) -> np.ndarray:
        out = np.zeros((rows, 300), dtype=np.float32)
        out[:, self.script[pos] if pos < len(self.script) else 2] = 1.0
        return out

    def start(self, input_ids, attention_mask):
        time.sleep(self.prefill_s)
        return self._logits(0, input_ids.shape[0]), 1

    def step(self, tokens, state):
        time.sleep(self.step_s)
        return self._logits(state, tokens.shape[0]), state + 1

    def num_params(self) -> int:
        return 0

    def size_bytes(self) -> int:
        return 1000


class Phases:
    """Records begin/step calls as the worker's Phases would receive them."""

    def __init__(self):
        self.begun: list[tuple[str, int]] = []
        self.steps: dict[str, int] = {}

    def begin(self, name: str, total: int = 0) -> None:
        self.begun.append((name, total))
        self.steps.setdefault(name, 0)

    def step(self, n: int = 1) -> None:
        name = self.begun[-1][0] if self.begun else ""
        self.steps[name] = self.steps.get(name, 0) + n

    def end(self) -> None:
        pass
