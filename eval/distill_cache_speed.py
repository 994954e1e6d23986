"""How much the cached teacher logits speed distillation up.

Trains the same 3-layer student from the same teacher on the same examples twice, with the
same loss: once reading the teacher's logits from the one-off pass that the `distill` stage
caches, once running the teacher forward on every step (what a distillation loop without
the cache does). Prints examples/s of both and the ratio, with and without the one-off
teacher pass counted.

    python eval/distill_cache_speed.py artifacts/bert_sentiment/baseline --examples 3000 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("teacher", type=Path, help="a fine-tuned classifier folder (e.g. the baseline stage's output)")
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "sst2")
    ap.add_argument("--examples", type=int, default=3000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", default="1,3,5")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from compress.data.context import StageContext
    from compress.tasks.classification.data import Data
    from compress.techniques.distillation import copy_layers, distill_loss
    from compress.formats.hf import load_model
    from compress.techniques.predict import encode, predict_logits
    from compress.recipe.schema import DataSpec
    from compress.stages.distill import Config
    from compress.techniques.train import train
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    data = Data(DataSpec(dataset=str(args.data.resolve()), max_train_examples=args.examples), Path.cwd())
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    teacher = load_model(args.teacher).eval()
    layers = [int(x) for x in args.layers.split(",")]
    cfg = Config(epochs=1, layers=layers)
    enc = encode(tokenizer, data.train, cfg.max_length)
    ctx = StageContext(stage_id="speed", config=cfg, input=None, out=Path(tempfile.mkdtemp()),  # type: ignore[arg-type]
                       recipe=SimpleNamespace(), log=print, threads=args.threads)

    t0 = time.perf_counter()
    logits = torch.from_numpy(predict_logits(teacher, tokenizer, enc, 64))  # [N, C], the one-off pass
    teacher_pass = time.perf_counter() - t0
    cached = train(ctx, copy_layers(teacher, layers), tokenizer, enc, cfg, distill_loss(logits, cfg), "cached teacher logits")

    T, alpha = cfg.temperature, cfg.alpha

    def live_loss(model, batch):  # the same loss, the teacher run on every step
        inputs = {k: v for k, v in batch.items() if k not in ("idx", "labels")}
        s = model(**inputs).logits
        with torch.no_grad():
            t = teacher(**inputs).logits
        kd = F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), log_target=True, reduction="batchmean")
        return alpha * kd * T * T + (1 - alpha) * F.cross_entropy(s, batch["labels"])

    live = train(ctx, copy_layers(teacher, layers), tokenizer, enc, cfg, live_loss, "teacher every step")

    n = len(enc)
    with_pass = n / (cached.seconds + teacher_pass)
    print(f"examples {n}, threads {args.threads}, student layers {layers}")
    print(f"cached logits:      {cached.examples_per_s:7.1f} ex/s  (teacher pass {teacher_pass:.1f}s once: {with_pass:.1f} ex/s counting it)")
    print(f"teacher every step: {live.examples_per_s:7.1f} ex/s")
    print(f"speed-up: {cached.examples_per_s / live.examples_per_s:.2f}x per epoch, "
          f"{with_pass / live.examples_per_s:.2f}x for one epoch including the one-off pass")


if __name__ == "__main__":
    main()
