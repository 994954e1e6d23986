"""`compress init`: a commented starter recipe for a model and a dataset, so a first run
needs no reading of the schema.

The columns are checked against the data (a wrong one is a one-line error naming the
columns there are), the sizes are chosen for the machine it runs on (CPU cores, GPU), and
the recipe is validated before it is written. Optional stages (distill, prune, export_onnx,
quantize_onnx) are added only when their kinds are registered and validate here.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import yaml

from compress.core.errors import CompressError, DataError, RecipeError

# Optional stage kinds, in chain order, with the stage they take by preference.
OPTIONAL = (
    ("distill", "baseline"),
    ("prune", "baseline"),
    ("export_onnx", "baseline"),
    ("quantize_onnx", "export_onnx"),
)


def machine() -> dict:
    from compress.bench.benchmark import cuda_available

    return {"cores": os.cpu_count() or 1, "gpu": cuda_available()}


def sizes(train_examples: int, mach: dict) -> dict:
    """Training subset, epochs and threads for this machine. Fine-tuning is the slow part
    on a CPU: a small CPU gets fewer training examples, a GPU trains on more."""
    cores, gpu = mach["cores"], mach["gpu"]
    if gpu:
        cap, why = 100_000, "a GPU is present"
    elif cores <= 4:
        cap, why = 4_000, f"{cores} CPU cores and no GPU: kept small so that fine-tuning takes minutes"
    elif cores <= 16:
        cap, why = 16_000, f"{cores} CPU cores and no GPU"
    else:
        cap, why = 32_000, f"{cores} CPU cores and no GPU"
    return {
        "max_train_examples": None if train_examples <= cap else cap,
        "why": why,
        "epochs": 2 if gpu else 1,
        # Benchmark threads: what one serving replica typically gets, at most what is here.
        "threads": max(1, min(cores, 4)),
        "devices": ["cpu", "cuda"] if gpu else ["cpu"],
    }


def token_length(texts: list[str], pairs: list[str] | None) -> int:
    """max_length estimate from word counts (p99 of about 1.4 WordPiece tokens per word, plus
    special tokens), rounded up to a multiple of 16 and kept in 32..512, without loading a
    tokenizer."""
    import numpy as np

    words = np.array([len(t.split()) + (len(pairs[i].split()) if pairs else 0) for i, t in enumerate(texts)])
    est = float(np.percentile(words, 99)) * 1.4 + 3
    return int(min(512, max(32, math.ceil(est / 16) * 16)))


def _where(source: str, out_dir: Path) -> str:
    """A local path relative to the recipe's folder (how recipes resolve paths); ids as given."""
    p = Path(source).expanduser()
    if source.startswith("package:") or not p.exists():
        return source
    try:
        return os.path.relpath(p.resolve(), out_dir.resolve())
    except ValueError:  # another drive
        return str(p.resolve())


# Column pairs of common pair tasks (GLUE's MRPC/RTE/STS-B, MNLI, QQP, QNLI), tried when the
# text column is left at its default and the data has no `sentence` column.
KNOWN_PAIRS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"),
               ("question", "sentence"))


def _load_data(dataset: str, text: str, label: str, text_pair: str | None = None, config: str | None = None,
               guess_pair: bool = False):
    """(Data, eval split, text column, text pair column)."""
    from compress.tasks.classification.data import Data
    from compress.recipe.schema import DataSpec

    candidates = [(text, text_pair)]
    if guess_pair and text_pair is None:
        candidates += list(KNOWN_PAIRS)
    first_missing: DataError | None = None
    for text_col, pair_col in candidates:
        last: DataError | None = None
        for eval_split in ("validation", "test"):
            spec = DataSpec(dataset=dataset, config=config, text=text_col, text_pair=pair_col, label=label,
                            eval_split=eval_split)
            try:
                return Data(spec, Path.cwd()), eval_split, text_col, pair_col
            except DataError as exc:
                msg = str(exc).replace("set data.text / data.label to the right names",
                                       "name them with --text / --text-pair / --label")
                if "no file for split" in msg or "cannot load" in msg:
                    last = DataError(msg)
                    continue
                if "missing column" in msg:
                    first_missing = first_missing or DataError(msg)
                    break  # the next pair of columns
                raise DataError(msg) from None
        else:
            assert last is not None
            raise last
    assert first_missing is not None
    raise first_missing  # about the columns asked for, not the guesses


def _flow(d: dict) -> str:
    return yaml.safe_dump(d, default_flow_style=True, width=10_000, sort_keys=False).strip()


def build(model: str, dataset: str, text: str, label: str, output: Path, mach: dict | None = None,
          text_pair: str | None = None, config: str | None = None, guess_pair: bool = False) -> str:
    """The recipe text (validated). `guess_pair`: the text column was not given, so a
    common pair of columns (premise/hypothesis, ...) is tried when `text` is missing."""
    from compress.recipe.schema import ModelSpec, validate_recipe
    from compress.core.registry import registry
    from compress.recipe.peek import peek_model_format

    mach = mach or machine()
    data, eval_split, text, text_pair = _load_data(dataset, text, label, text_pair, config, guess_pair)
    fmt = peek_model_format(ModelSpec(source=model), Path.cwd())
    size = sizes(len(data.train_full), mach)
    max_length = token_length(data.train_full.texts, data.train_full.pairs)
    name = output.stem if output.stem not in ("recipe", "") else dataset.rstrip("/").split("/")[-1]
    name = re.sub(r"[^A-Za-z0-9_-]", "_", name).strip("_-")[:64] or "compress"

    stages: list[tuple[dict, str]] = []  # (stage, comment)
    head = None
    if fmt == "hf":
        from compress.recipe.peek import head_labels, peek_model_config

        head = head_labels(peek_model_config(ModelSpec(source=model), Path.cwd()) or {})
    # A classifier is its own baseline only when its head has the data's classes.
    needs_finetune = fmt != "hf" or len(head or ()) != data.num_labels
    base = "baseline" if needs_finetune else "model"
    if needs_finetune:
        why = ("the model has no classification head" if fmt == "checkpoint"
               else f"the model's classification head has {len(head)} labels, the data {data.num_labels}" if head
               else "the model is not at hand to check: fine-tuning works on a checkpoint or a classifier")
        stages.append(({"id": "baseline", "uses": "finetune", "with": {
            "epochs": size["epochs"], "lr": 1.0e-4, "batch_size": 32, "max_length": max_length}},
            f"the task baseline ({why})"))
    stages.append(({"id": "int8", "uses": "quantize_dynamic", "from": base,
                    "with": {"scheme": "per_channel", "mode": "accuracy_aware"}},
                   "INT8 Linear layers; sensitive ones kept in fp32 within half the accuracy budget"))
    kinds = registry()
    optional: set[str] = set()
    skipped: list[str] = []
    for kind_name, prefer in OPTIONAL:
        if kind_name not in kinds:
            continue
        kind = kinds[kind_name]
        source = base if prefer == "baseline" else prefer
        if source not in ("model", *(s["id"] for s, _ in stages)):
            skipped.append(f"{kind_name} (its input stage was left out)")
            continue
        settings = {}
        if "max_length" in kind.config.model_fields:
            settings["max_length"] = max_length
        if "epochs" in kind.config.model_fields:
            settings["epochs"] = size["epochs"]
        try:
            kind.config.model_validate(settings)
        except Exception:
            skipped.append(f"{kind_name} (needs settings: see `compress stages {kind_name}`)")
            continue
        stages.append(({"id": kind_name, "uses": kind_name, "from": source, "with": settings}, kind.summary))
        optional.add(kind_name)

    # Validate; an optional stage that does not validate here (say, an architecture it does
    # not support) is left out with a note rather than written broken.
    while True:
        text_out = _render(model, dataset, text, label, eval_split, name, stages, size, max_length, base,
                           output, mach, skipped, len(data.train_full), fmt, text_pair, config, data.label_names)
        try:
            validate_recipe(yaml.safe_load(text_out), str(output), output)
            return text_out
        except RecipeError as exc:
            m = re.match(r"stages\[(\d+)\]", exc.key or "")
            sid = stages[int(m.group(1))][0]["id"] if m and int(m.group(1)) < len(stages) else None
            if sid not in optional:
                raise
            drop = {sid} | {s["id"] for s, _ in stages if s.get("from") == sid}
            skipped += [f"{d} ({exc.message})" if d == sid else f"{d} (its input stage was left out)" for d in drop]
            stages = [(s, c) for s, c in stages if s["id"] not in drop]
            optional -= drop


def _render(model, dataset, text, label, eval_split, name, stages, size, max_length, base, output, mach,
            skipped, n_train, fmt, text_pair=None, config=None, label_names=None) -> str:
    out_dir = output.parent
    q = json.dumps  # a JSON string is a valid YAML scalar, whatever characters it holds
    cap = size["max_train_examples"]
    lines = [
        f"# compress run {output.name}   (check first: compress validate {output.name})",
        f"# Starter recipe written by `compress init` for this machine ({mach['cores']} CPU cores, "
        f"{'a GPU' if mach['gpu'] else 'no GPU'}). Every key is documented in `compress stages NAME`.",
        "schema_version: 1",
        f"name: {q(name)}",
        "",
        "model:",
        f"  source: {q(_where(model, out_dir))}"
        + (f"   # {'a classifier: used as the baseline as is' if fmt == 'hf' else 'a checkpoint: fine-tuned below'}"
           if fmt else "   # not at hand offline: fetched from the hub on the first run"),
        "",
        "data:",
        f"  dataset: {q(_where(dataset, out_dir))}",
        *([f"  config: {q(config)}                # the dataset's configuration"] if config else []),
        f"  text: {q(text)}",
        *([f"  text_pair: {q(text_pair)}          # second text of each pair"] if text_pair else []),
        f"  label: {q(label)}",
        *([f"  label_names: {_flow(label_names)}   # class names in id order: every variant's config.json "
           f"records them"] if label_names else []),
        "  train_split: train",
        f"  eval_split: {eval_split}                # every variant is scored on it",
        f"  max_train_examples: {'null' if cap is None else cap}"
        + f"   # of {n_train}; {size['why']}" + ("" if cap is None else "; raise it for accuracy"),
        "  seed: 0",
        "",
        "stages:",
    ]
    for stage, comment in stages:
        lines += [f"  # {comment}", f"  - id: {stage['id']}", f"    uses: {stage['uses']}"]
        if stage.get("from"):
            lines.append(f"    from: {stage['from']}")
        lines.append(f"    with: {_flow(stage.get('with', {}))}")
    for s in skipped:
        lines.append(f"  # left out: {s}")
    lines += [
        "",
        "benchmark:",
        f"  devices: [{', '.join(size['devices'])}]",
        f"  threads: {size['threads']}                     # per variant, torch and onnxruntime alike",
        "  batch_sizes: [1, 8, 32]",
        f"  max_length: {max_length}                # p99 length estimated from the training texts",
        "",
        "budget:",
        f"  baseline: {base}",
        "  max_accuracy_drop: 1.0          # points against the baseline",
        "  gate_on: point                  # ci_lower: gate on the lower end of the 95% interval (stricter)",
        "  latency_p95_ms: null            # optional SLO on batch-1 p95; $/1K then uses the cheapest batch size within it",
        "  max_size_mb: null",
        "  objective: min_cost             # or min_latency, min_size",
        "  tie_tolerance: 0.25             # within 25% of the best $/1K or p95: quality beyond chance, else the smallest, wins",
        "",
    ]
    return "\n".join(lines)


def write(model: str, dataset: str, text: str, label: str, output: Path, force: bool = False,
          text_pair: str | None = None, config: str | None = None, guess_pair: bool = False) -> str:
    if output.exists() and not force:
        raise CompressError(f"{output} exists; choose another --output or pass --force to overwrite it")
    # The folder first: the recipe's relative paths are checked from it.
    output.parent.mkdir(parents=True, exist_ok=True)
    text_out = build(model, dataset, text, label, output, text_pair=text_pair, config=config, guess_pair=guess_pair)
    from compress.core.files import write_file

    write_file(output, text_out)
    return text_out
