"""A compressed causal LM against what a user gets alone: Optimum's ONNX export, onnxruntime's
MatMulNBits INT4 with its default settings (block 128, asymmetric, fp32 activations, MatMuls
only: the tied lm_head and the embedding stay fp32), run with Optimum's
ORTModelForCausalLM.generate.

In one process, same prompts, same thread count, one after the other: decode tokens/s
(batch 1, greedy, `--new-tokens` tokens with eos ignored), time to first token, perplexity
on the same windows of a raw text file, size on disk. Prints both rows and the ratios.

    python eval/peer_llm.py BEST_FOLDER --source HF_FOLDER [--peer PEER_FOLDER] [--threads 2]

BEST_FOLDER: an `onnx` causal-LM folder (compress.formats.causal_onnx), a `genai` folder
(compress.formats.genai) or an `hf` folder.
The peer is built from HF_FOLDER into --peer (or a temporary folder) unless --peer holds one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext2" / "wiki.test.raw"


def build_peer(source: Path, out: Path) -> Path:
    """What a user runs: ORTModelForCausalLM export, then MatMulNBitsQuantizer(model) as is."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    import logging

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)  # a line per node
    fp32 = out.with_name(out.name + "-fp32")
    if not (fp32 / "model.onnx").is_file():
        ORTModelForCausalLM.from_pretrained(source, export=True, use_cache=True).save_pretrained(fp32)
        AutoTokenizer.from_pretrained(source).save_pretrained(fp32)
    q = MatMulNBitsQuantizer(onnx.load(str(fp32 / "model.onnx")))
    q.process()
    shutil.copytree(fp32, out, ignore=shutil.ignore_patterns("model.onnx*"), dirs_exist_ok=True)
    q.model.save_model_to_file(str(out / "model.onnx"), use_external_data_format=False)
    return out


def windows(tokenizer, path: Path, count: int, context: int) -> list[list[int]]:
    """The first `count` windows of `context` tokens of the file (rows joined as the Hugging
    Face recipe does)."""
    rows = [r for r in path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n") if r.strip()]
    text = "\n\n".join(rows)
    ids = tokenizer(text[: 400 * count * context // 64])["input_ids"]  # ~6 characters a token: enough text
    if len(ids) < count * context:
        raise SystemExit(f"{path}: only {len(ids)} tokens for {count} windows of {context}; ask for fewer")
    return [ids[i * context : (i + 1) * context] for i in range(count)]


def model_bytes(folder: Path) -> int:
    from compress.formats import NON_MODEL_FILES

    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name not in NON_MODEL_FILES)


class Ours:
    """The compressed variant through compress's own predictor and greedy loop."""

    def __init__(self, folder: Path, threads: int):
        from compress.formats import causal, causal_onnx, genai

        self.causal = causal
        if (folder / genai.CONFIG_FILE).is_file():
            self.pred = genai.load(folder, "cpu", threads, {})
        elif (folder / "model.onnx").is_file():
            self.pred = causal_onnx.load(folder, "cpu", threads, {})
        else:
            import torch

            torch.set_num_threads(threads)
            self.pred = causal.load_hf(folder, "cpu", threads, {})
        self.tokenizer = self.pred.tokenizer

    def generate(self, ids: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
        """-> (ttft s, mean decode step s, tokens)"""
        x, m = self.causal.left_pad([ids], 0)
        marks: list[float] = []
        t0 = time.perf_counter()
        out = self.causal.greedy(self.pred, x, m, new_tokens, on_token=lambda i: marks.append(time.perf_counter()),
                                 stop_at_eos=False)
        return marks[0] - t0, (marks[-1] - marks[0]) / max(len(marks) - 1, 1), out[0].tolist()

    def nll(self, window: list[int]) -> float:
        x, m = self.causal.right_pad([window], 0)
        return -float(self.pred.logprobs(x, m).sum())


class Peer:
    """Optimum's ORTModelForCausalLM on the peer folder, timed through `generate`."""

    def __init__(self, folder: Path, threads: int):
        import onnxruntime as ort
        import torch
        from optimum.onnxruntime import ORTModelForCausalLM
        from transformers import AutoTokenizer

        torch.set_num_threads(threads)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.torch = torch
        self.model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True, session_options=opts,
                                                         provider="CPUExecutionProvider")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)

    def generate(self, ids: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
        x = self.torch.tensor([ids])
        t0 = time.perf_counter()
        self.model.generate(x, max_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = self.model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        total = time.perf_counter() - t0
        return ttft, (total - ttft) / max(new_tokens - 1, 1), out[0, len(ids):].tolist()

    def nll(self, window: list[int]) -> float:
        torch = self.torch
        x = torch.tensor([window])
        with torch.inference_mode():
            logits = self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, :-1].float()  # [T-1, V]
            lp = torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])
        return -float(lp.sum())


def measure(runner, prompts: list[list[int]], wins: list[list[int]], new_tokens: int) -> dict:
    runner.generate(prompts[0], 8)  # warm-up: first-call allocations
    ttft, step = [], []
    for p in prompts:
        a, b, _ = runner.generate(p, new_tokens)
        ttft.append(a)
        step.append(b)
    nll = sum(runner.nll(w) for w in wins)
    tokens = sum(len(w) - 1 for w in wins)
    return {"decode_tok_s": 1.0 / float(np.median(step)), "ttft_ms": 1000 * float(np.median(ttft)),
            "perplexity": float(np.exp(nll / tokens))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("best", type=Path, help="the compressed variant's folder (onnx or hf)")
    ap.add_argument("--source", type=Path, help="the fp32 transformers folder the peer is built from")
    ap.add_argument("--peer", type=Path, help="the peer's folder (built there from --source when it has no model.onnx)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=5, help="prompts timed (medians are reported)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--text", type=Path, default=WIKITEXT)
    args = ap.parse_args(argv)

    from compress.tasks.causal_lm import export as lm_export

    with tempfile.TemporaryDirectory(prefix="peer_llm-") as tmp:
        peer_dir = args.peer or Path(tmp) / "peer"
        if not (peer_dir / "model.onnx").is_file():
            if args.source is None:
                ap.error("give --source (to build the peer) or --peer (a built one)")
            build_peer(args.source, peer_dir)
        ours, peer = Ours(args.best, args.threads), Peer(peer_dir, args.threads)
        prompts = lm_export.tokenizer_prompts(ours.tokenizer, args.prompts)
        wins = windows(ours.tokenizer, args.text, args.windows, args.context)
        rows = {}
        for name, runner, folder in (("ours", ours, args.best), ("peer", peer, peer_dir)):
            rows[name] = {"folder": str(folder), "size_mb": model_bytes(folder) / 1e6,
                          **measure(runner, prompts, wins, args.new_tokens)}
    for name, row in rows.items():
        print(f"{name:5s} decode {row['decode_tok_s']:6.1f} tok/s  ttft {row['ttft_ms']:6.1f} ms  "
              f"ppl {row['perplexity']:7.3f}  size {row['size_mb']:6.1f} MB  {row['folder']}")
    o, p = rows["ours"], rows["peer"]
    ratios = {"decode": o["decode_tok_s"] / p["decode_tok_s"], "ttft": o["ttft_ms"] / p["ttft_ms"],
              "perplexity": o["perplexity"] / p["perplexity"], "size": o["size_mb"] / p["size_mb"]}
    print("ratios (ours / peer): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(json.dumps({"rows": rows, "ratios": ratios, "threads": args.threads, "new_tokens": args.new_tokens,
                      "windows": args.windows, "context": args.context}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
