"""GGUF files run by llama.cpp (llama-cpp-python's bindings to its C API): the `gguf` format.

A `gguf` folder holds `model.gguf`, the transformers tokenizer and config.json of the model it
was made from, and `llamacpp.json` (the runtime settings: the KV cache's type). Token ids come
from the transformers tokenizer, as for every other causal-LM row, and llama.cpp is handed ids,
never text: every runtime scores and times the same ids.

Why the C API (llama_batch, llama_decode, llama_get_logits_ith) rather than `Llama.eval`: the
high-level class holds one sequence, and the benchmark times batches of several prompts
(llama.cpp's batched decoding: one sequence id per row, every row's next token in one
llama_decode). Each row keeps its own positions from 0 and no padding enters the KV cache, so
a row of a batch decodes exactly as it does alone.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import numpy as np

from compress.formats.causal import CausalLM

GGUF_FILE = "model.gguf"
SETTINGS_FILE = "llamacpp.json"
# KV cache type -> (llama.cpp's ggml type name, bytes per cached value). q8_0 stores blocks of
# 32 int8 values with one fp16 scale: 34 bytes per 32 values.
KV_TYPES = {"f16": ("F16", 2.0), "q8_0": ("Q8_0", 34 / 32)}
# Room kept per sequence for generated tokens beyond its prompt, and the step the context is
# sized in: a context big enough for every prompt of a run is made once (in the warm-up), not
# again inside a timed call.
GEN_ROOM = 512
CTX_STEP = 1024

_quiet_callback = None  # the C callback must outlive every call that logs
_extra_bufts: dict[str, bool] = {}  # build's system-info line -> may llama.cpp use its extra buffer types
PROBE_TOKENS = 8
REPACK_ENV = "COMPRESS_LLAMACPP_REPACK"  # 0 or 1: skip the probe of extra_buffers


def library():
    """llama_cpp, with the backend initialised once and its logging silenced (it writes every
    tensor's line to stderr). ImportError with the install line when it is absent."""
    global _quiet_callback
    try:
        import llama_cpp
    except ImportError as exc:
        raise ImportError("the gguf format runs on llama.cpp: pip install -e '.[gguf]' (builds it, a few minutes)") from exc
    if _quiet_callback is None:
        _quiet_callback = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_quiet_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
    return llama_cpp


def _machine_key(L, build: str) -> str:
    """This CPU, kernel and llama.cpp build (its system-info line): what decides whether AMX runs here."""
    import hashlib
    import platform

    from compress.core.manifest import hardware

    raw = "|".join([json.dumps(hardware(with_gpu=False)["cpu"], sort_keys=True), platform.release(),
                    getattr(L, "__version__", "?"), build])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _probe(file: str) -> None:
    """Child process: load `file` with llama.cpp's defaults and decode a few tokens. It dies by
    a signal where the AMX kernels fault (see extra_buffers)."""
    L = library()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(file.encode(), mp)
    if not model:
        raise SystemExit(2)
    ctx = _Context(L, model, 64, 1, PROBE_TOKENS, 1, "f16")
    n = PROBE_TOKENS
    ctx.decode(list(range(1, n + 1)), list(range(n)), [0] * n, [False] * (n - 1) + [True])
    ctx.close()
    L.llama_model_free(model)


def extra_buffers(file: Path) -> bool:
    """May llama.cpp repack weights into its extra buffer types (AMX, CPU_REPACK) on this machine?

    Why a probe: llama.cpp built with -march=native on a CPU that reports AMX puts the weights
    in an AMX buffer, and on some virtualised Sapphire Rapids hosts its AMX matmul takes a
    general protection fault at the first decode (llama.cpp issue 20824, closed without a fix;
    the kernel grants the AMX permission, so nothing short of running it tells). Only where the
    build reports AMX_INT8 is a child process run, once per machine and build (the verdict is
    cached); where it dies, every llama.cpp model here loads with use_extra_bufts off (llama-server:
    --no-repack), which also gives up the AVX repacking: slower, not wrong."""
    import os
    import subprocess
    import sys

    forced = os.environ.get(REPACK_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    L = library()
    build = L.llama_print_system_info().decode(errors="replace")
    if "AMX_INT8 = 1" not in build:
        return True
    if build in _extra_bufts:  # one process runs on one machine: the build line keys its verdict
        return _extra_bufts[build]
    record = Path.home() / ".cache" / "compress" / "llamacpp" / f"extra-buffers-{_machine_key(L, build)}.json"
    try:
        _extra_bufts[build] = bool(json.loads(record.read_text(encoding="utf-8"))["works"])
        return _extra_bufts[build]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no verdict yet (or a damaged one): probe
    child = subprocess.run([sys.executable, "-c", f"from compress.formats.llamacpp import _probe; _probe({str(file)!r})"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    if child.returncode > 0:  # an ordinary failure (unreadable file): no verdict on AMX, keep the default
        return True
    works = child.returncode == 0  # < 0: killed by a signal (SIGSEGV from the AMX kernels)
    _extra_bufts[build] = works
    from compress.core.files import write_file

    record.parent.mkdir(parents=True, exist_ok=True)
    write_file(record, json.dumps({"works": works, "signal": -child.returncode if not works else None,
                                   "probed_with": str(file)}, indent=1))
    return works


def read_settings(folder: Path) -> dict:
    path = Path(folder) / SETTINGS_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        from compress.core.errors import ArtifactError

        raise ArtifactError(f"{path}: not valid JSON; rebuild the variant") from exc
    kv = settings.get("kv_cache_type", "f16")
    if kv not in KV_TYPES:
        from compress.core.errors import ArtifactError

        raise ArtifactError(f"{path}: kv_cache_type '{kv}' is not one of {', '.join(KV_TYPES)}; rebuild the variant")
    return {"kv_cache_type": kv}


class _Context:
    """One llama.cpp context: `n_seq` sequences sharing `n_ctx` cells of KV cache."""

    def __init__(self, L, model, n_ctx: int, n_seq: int, n_batch: int, threads: int, kv: str):
        self.L, self.n_ctx, self.n_seq, self.n_batch = L, n_ctx, n_seq, n_batch
        p = L.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, min(n_batch, 512), n_seq
        p.n_threads = p.n_threads_batch = threads
        p.kv_unified = True  # one cache for every sequence: rows of unequal length share it
        ggml = getattr(L, f"GGML_TYPE_{KV_TYPES[kv][0]}")
        p.type_k = p.type_v = ggml
        # A quantized V cache needs flash attention in llama.cpp; f16 keeps llama.cpp's default.
        if kv != "f16":
            p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.ctx = L.llama_init_from_model(model, p)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} tokens x {n_seq} sequences")
        self.batch = L.llama_batch_init(n_batch, 0, 1)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list[int], pos: list[int], seq: list[int], want: list[bool]) -> None:
        """One llama_decode of at most n_batch tokens."""
        b, n = self.batch, len(tokens)
        for i in range(n):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tokens[i], pos[i], 1, int(want[i])
            b.seq_id[i][0] = seq[i]
        b.n_tokens = n
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc}: {'no room in the KV cache' if rc == 1 else 'error'})")

    def logits(self, n_out: int, vocab: int) -> np.ndarray:
        """The logits of this decode's outputs, in batch order: [n_out, V] float32 (a copy)."""
        ptr = self.L.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, vocab)).copy()

    def close(self) -> None:
        if self.ctx:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
            self.ctx = None


class LlamaCppCausal(CausalLM):
    """A GGUF file in llama.cpp, on the CPU, keeping the causal-LM contract."""

    def __init__(self, path: Path, device: str, threads: int, options: dict):
        from transformers import AutoConfig, AutoTokenizer

        from compress.core.errors import ArtifactError

        super().__init__(path)
        L = self.L = library()
        file = Path(path) / GGUF_FILE
        if not file.is_file():
            raise ArtifactError(f"{path}: no {GGUF_FILE}; not a gguf variant folder (rebuild it with quantize_gguf)")
        self.settings = read_settings(Path(path))
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = extra_buffers(file)
        if not mp.use_extra_bufts:
            self.notes.append("llama.cpp's AMX kernels fault on this machine: weights not repacked (use_extra_bufts off)")
        self.model = L.llama_model_load_from_file(str(file).encode(), mp)
        if not self.model:
            raise ArtifactError(f"{file}: llama.cpp cannot load it (truncated, or an architecture this build lacks)")
        self.n_vocab = int(L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model)))
        self.threads = int(threads)
        self.device = "cpu"
        if device != "cpu":
            self.notes.append("llama.cpp built for the CPU here; ran on the CPU")
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        self.config = AutoConfig.from_pretrained(path, trust_remote_code=False)
        self.context_length = int(getattr(self.config, "max_position_embeddings", 0) or 2048)
        self.kv_cache_bytes = KV_TYPES[self.settings["kv_cache_type"]][1]
        self._gen: _Context | None = None
        self._score: _Context | None = None

    def _context(self, which: str, per_seq: int, n_seq: int, n_batch: int) -> _Context:
        have = getattr(self, which)
        if have is not None and have.n_ctx >= per_seq * n_seq and have.n_seq >= n_seq and have.n_batch >= n_batch:
            have.clear()
            return have
        if have is not None:
            have.close()
        ctx = _Context(self.L, self.model, per_seq * n_seq, n_seq, n_batch, self.threads, self.settings["kv_cache_type"])
        setattr(self, which, ctx)
        return ctx

    def logprobs(self, input_ids: np.ndarray, attention_mask: np.ndarray,
                 want: np.ndarray | None = None) -> np.ndarray:
        B, T = input_ids.shape
        width = -(-T // CTX_STEP) * CTX_STEP
        ctx = self._context("_score", width, 1, width)  # every token's logits: n_batch >= T
        out = np.zeros((B, max(T - 1, 0)), dtype=np.float32)
        for b in range(B):
            n = int(attention_mask[b].sum())  # right-padded: the row's real tokens come first
            ids = [int(t) for t in input_ids[b, :n]]
            if n < 2:
                continue
            # Logits only where the caller reads them (llama.cpp skips the output projection
            # of the other tokens); the last token's are never read.
            read = np.ones(n - 1, bool) if want is None else np.asarray(want[b, : n - 1], bool)
            if not read.any():
                continue
            ctx.clear()
            ctx.decode(ids, list(range(n)), [0] * n, [bool(r) for r in read] + [False])
            cols = np.flatnonzero(read)  # [K]
            x = ctx.logits(len(cols), self.n_vocab).astype(np.float32)  # [K, V]
            top = x.max(-1, keepdims=True)
            lse = np.log(np.exp(x - top).sum(-1, dtype=np.float64)) + top[:, 0]
            out[b, cols] = x[np.arange(len(cols)), input_ids[b, 1:n][cols]] - lse
        return out

    def start(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> tuple[np.ndarray, Any]:
        B = input_ids.shape[0]
        rows = [[int(t) for t, m in zip(input_ids[b], attention_mask[b]) if m] for b in range(B)]  # left padding off
        longest = max(len(r) for r in rows)
        per_seq = min(-(-(longest + GEN_ROOM) // CTX_STEP) * CTX_STEP, max(self.context_length, longest + 1))
        n_batch = min(sum(len(r) for r in rows), 4096)
        ctx = self._context("_gen", per_seq, B, max(n_batch, B))
        # The prompts go in as few llama_decode calls as n_batch allows, each row its own
        # sequence; only each row's last token gets logits (the first new token's).
        toks, pos, seq, want = [], [], [], []
        for s, r in enumerate(rows):
            toks += r
            pos += range(len(r))
            seq += [s] * len(r)
            want += [False] * (len(r) - 1) + [True]
        logits = []
        for i in range(0, len(toks), ctx.n_batch):
            j = min(i + ctx.n_batch, len(toks))
            ctx.decode(toks[i:j], pos[i:j], seq[i:j], want[i:j])
            if any(want[i:j]):
                logits.append(ctx.logits(sum(want[i:j]), self.n_vocab))
        return np.concatenate(logits), (ctx, [len(r) for r in rows])

    def step(self, tokens: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        ctx, pos = state
        B = len(pos)
        ctx.decode([int(t) for t in tokens], list(pos), list(range(B)), [True] * B)
        return ctx.logits(B, self.n_vocab), (ctx, [p + 1 for p in pos])

    def num_params(self) -> int:
        return int(self.L.llama_model_n_params(self.model))

    def memory_bytes(self) -> int:
        return int(self.L.llama_model_size(self.model))

    def close(self) -> None:
        for which in ("_gen", "_score"):
            ctx = getattr(self, which)
            if ctx is not None:
                ctx.close()
                setattr(self, which, None)
        if self.model:
            self.L.llama_model_free(self.model)
            self.model = None

    def __del__(self):  # the benchmark worker drops a predictor; llama.cpp's memory goes with it
        try:
            self.close()
        except Exception:
            pass


def load(path: Path, device: str, threads: int, options: dict) -> LlamaCppCausal:
    return LlamaCppCausal(Path(path), device, threads, options)
