"""Model cards: a README.md with Hugging Face metadata in every variant folder, written
after the benchmark from report.json, so that a folder (the selected one above all) can be
shared or pushed to the hub as it is.

The card is not part of the stage's output: compress/data/artifacts.py leaves MODEL_CARD out of
a folder's checksums, so writing it never invalidates the stage cache, and it is rewritten
with the latest figures on every run. Everything that comes from data, recipes or errors
goes into the YAML front matter through yaml.safe_dump, and into the Markdown body through
`_text` (no HTML, no line breaks, no Markdown table or front matter syntax).
"""

from __future__ import annotations

import re
from pathlib import Path

from compress.core.files import write_file
from compress.data.artifacts import MARKER, MODEL_CARD
from compress.reports.report_json import Report, as_report, money

# A hub id: "name" or "owner/name", as the hub spells them (no path, no scheme).
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?")
LIBRARY = {"hf": "transformers", "torch_int8": "transformers", "bnb_4bit": "transformers", "onnx": "onnx"}


def _hub_id(source: str | None) -> str | None:
    if not source or source.startswith(("package:", ".", "/", "~")) or Path(source).exists():
        return None
    return source if _HUB_ID.fullmatch(source) and ".." not in source else None


def _text(value, limit: int = 300) -> str:
    """Text from a report (notes, errors, ids) made inert in Markdown: one line, no control
    characters, no HTML, table and emphasis syntax escaped."""
    s = re.sub(r"[\x00-\x1f\x7f]+", " ", str(value))
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = re.sub(r"([\\`*_\[\]|#!])", r"\\\1", s)
    return s[:limit] + ("..." if len(s) > limit else "")


def _code(value, limit: int = 200) -> str:
    """Text for inside a Markdown code span: one line, no backticks (escapes do not work there)."""
    s = re.sub(r"[\x00-\x1f\x7f]+", " ", str(value)).replace("`", "'")
    return s[:limit] + ("..." if len(s) > limit else "")


def _name(source: str | None) -> str:
    """How a card names a model or dataset: a hub id or package as it is, a local path by
    its last part (a shared card should not carry the paths of the machine that made it)."""
    if not source:
        return "?"
    if _hub_id(source) or source.startswith("package:"):
        return source
    return Path(source).name or source


def chain(recipe: dict, variant: str) -> list[dict]:
    """The stages from the recipe's model to `variant`, in order: [{id, uses, with}]."""
    stages = {s["id"]: s for s in recipe.get("stages", [])}
    out, sid = [], variant
    while sid in stages and len(out) <= len(stages):
        out.append(stages[sid])
        sid = stages[sid].get("from")
    return out[::-1]


def _settings(with_: dict, limit: int = 6) -> str:
    items = [f"{k}={v}" for k, v in (with_ or {}).items() if v is not None and not isinstance(v, (dict, list))]
    return ", ".join(items[:limit]) + (", ..." if len(items) > limit else "")


# How the hub's model-index names a secondary metric of ours.
_HUB_METRIC = {"macro_f1": {"type": "f1", "name": "macro-F1"}}


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def card(report: "Report | dict", variant: str) -> str:
    """The README.md of one variant folder."""
    import yaml

    report = as_report(report)
    if report.task_info.name == "causal-lm":
        return lm_card(report, variant)
    m = report.manifest
    recipe = m.recipe
    metric, secondary = report.metric, report.task_info.secondary
    rows = [r for r in report.rows if r.id == variant]
    ok = [r for r in rows if r.ok]
    fmt = rows[0].format if rows else None
    data_src = _name(recipe.get("data", {}).get("dataset"))
    base = _hub_id(recipe.get("model", {}).get("source"))
    dataset = _hub_id(recipe.get("data", {}).get("dataset"))
    steps = chain(recipe, variant)
    eval_split = recipe.get("data", {}).get("eval_split", "validation")

    meta: dict = {}
    if base:
        meta["base_model"] = base
    if dataset:
        meta["datasets"] = [dataset]
    meta["library_name"] = LIBRARY.get(fmt or "", "compress")
    meta["pipeline_tag"] = "text-classification"
    meta["tags"] = list(dict.fromkeys(["compress", "text-classification", *(s["uses"] for s in steps),
                                       *([fmt] if fmt else [])]))
    meta["metrics"] = [metric.name, *(_HUB_METRIC.get(s.name, {}).get("type", s.name) for s in secondary)]
    deciding = next((r for r in ok if r.device == report.decision.device), ok[0] if ok else None)
    if deciding is not None:
        meta["model-index"] = [{
            "name": variant,
            "results": [{
                "task": {"type": "text-classification"},
                "dataset": {"name": data_src, "type": dataset or data_src, "split": str(eval_split)},
                "metrics": [
                    {"type": metric.name, "value": round(deciding.quality, 2)},
                    *({**_HUB_METRIC.get(s.name, {"type": s.name}), "value": round(getattr(deciding, s.name), 2)}
                      for s in secondary if getattr(deciding, s.name, None) is not None),
                ],
            }],
        }]

    cpu = m.hardware["cpu"]
    selected = report.decision.selected == variant
    lines = [f"# {_text(variant)}", ""]
    lines.append(
        f"A text classifier (`{_code(fmt)}` format) made by compress from "
        f"`{_code(_name(recipe.get('model', {}).get('source')))}`, "
        f"evaluated on `{_code(data_src)}` ({_text(eval_split)} split, {m.data.get('eval_examples')} examples)."
        + (" **Selected for deployment** by this run." if selected else "")
    )
    lines += ["", "## Compression chain", ""]
    lines += [f"{i}. `{_code(s['id'])}`: `{_code(s['uses'])}`" + (f" ({_text(_settings(s.get('with')))})"
                                                             if _settings(s.get("with")) else "")
              for i, s in enumerate(steps, 1)] or ["(the recipe's model, unchanged)"]
    heads = [f"{metric.name} {metric.unit}".strip(), "delta vs baseline (95% CI)",
             *(f"{s.label or s.name}" for s in secondary)]
    lines += ["", "## Measured", "",
              "| device | " + " | ".join(heads) + " | size MB | p50 / p95 ms (batch 1) "
              f"| best throughput {report.task_info.throughput_unit} | $/1K | verdict |",
              "|---" * (len(heads) + 6) + "|"]
    for r in rows:
        if not r.ok:
            lines.append(f"| {_text(r.device)} | failed: {_text(r.error, 120)} |" + " |" * (len(heads) + 4))
            continue
        ci = r.delta_ci95
        delta = "-" if r.delta is None else f"{r.delta:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
        best = max((r.throughput or {}).values(), default=None)
        figures = [f"{r.quality:.2f}", delta, *(_num(getattr(r, s.name, None), ".2f") for s in secondary)]
        lines.append(
            f"| {_text(r.device)} | " + " | ".join(figures) + f" | {r.size_mb:.1f} | "
            f"{r.latency_ms.p50:.2f} / {r.latency_ms.p95:.2f} | {_num(best, ',.0f')} | "
            f"{money(r.usd_per_1k)} | {_text(r.verdict or '')} |")
    notes = [n for r in rows for n in r.notes]
    if notes:
        lines += ["", *[f"- {_text(n)}" for n in notes]]
    lines += ["", f"Baseline: `{_code(report.budget.baseline)}`. Machine: {_text(cpu.get('model'))} "
              f"({_text(cpu.get('arch'))}, {m.threads} threads of {cpu.get('cores')} cores). "
              f"{metric.name.capitalize()} at batch 1 over the whole eval split; latency at batch 1 after warm-up; the "
              f"interval is a paired bootstrap 95% interval of the delta. compress "
              f"{_text(m.versions.get('compress', '?'))}, run started {_text(m.started or '?')}."]
    lines += ["", "## Use", "", *_usage(fmt)]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=False, width=1000)
    return f"---\n{front}---\n\n" + "\n".join(lines) + "\n"


def lm_card(report: Report, variant: str) -> str:
    """The README.md of a causal-LM variant folder: perplexity and the task evals against the
    baseline with their intervals, generation speed, $ per 1M output tokens, memory fit."""
    import yaml

    m = report.manifest
    recipe = m.recipe
    rows = [r for r in report.rows if r.id == variant]
    fmt = rows[0].format if rows else None
    source = recipe.get("model", {}).get("source")
    steps = chain(recipe, variant)
    meta: dict = {}
    if _hub_id(source):
        meta["base_model"] = source
    meta["library_name"] = {"hf": "transformers", "onnx": "onnx", "genai": "onnxruntime-genai", "gguf": "gguf"}.get(fmt or "", "compress")
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = list(dict.fromkeys(["compress", "text-generation", *(s["uses"] for s in steps), *([fmt] if fmt else [])]))
    selected = report.decision.selected == variant
    lines = [f"# {_text(variant)}", "",
             f"A causal language model (`{_code(fmt)}` format) made by compress from `{_code(_name(source))}`."
             + (" **Selected for deployment** by this run." if selected else ""),
             "", "## Compression chain", ""]
    lines += [f"{i}. `{_code(s['id'])}`: `{_code(s['uses'])}`" + (f" ({_text(_settings(s.get('with')))})"
                                                             if _settings(s.get("with")) else "")
              for i, s in enumerate(steps, 1)] or ["(the recipe's model, unchanged)"]
    lines += ["", "## Measured", "", "| device | eval | figure | delta vs baseline (95% CI) |", "|---|---|---|---|"]
    for r in rows:
        if not r.ok or r.lm is None:
            lines.append(f"| {_text(r.device)} | failed: {_text(r.error, 120)} | | |")
            continue
        for e in r.lm.evals:
            ci = e.delta_ci95
            unit = "%" if e.metric == "perplexity" else "points"
            delta = "-" if e.delta is None else f"{e.delta:+.2f} {unit}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
            lines.append(f"| {_text(r.device)} | {_text(e.name)} | {e.metric} {e.value:.3f} | {delta} |")
    for r in rows:
        if r.ok and r.lm is not None:
            lm = r.lm
            speeds = ", ".join(f"batch {b}: {v:.1f}" for b, v in lm.decode_tokens_per_s.items())
            lines += ["", f"On {_text(r.device)}: {r.size_mb:.1f} MB; time to first token p50 "
                      f"{_num(lm.ttft_ms.get('p50'), '.1f')} ms, {_num(lm.tpot_ms.get('p50'), '.2f')} ms per output "
                      f"token at batch 1; decode tokens/s {speeds}; $ per 1M output tokens "
                      f"{money(lm.usd_per_1m_tokens)}."]
            if lm.memory_plan is not None:
                plan = lm.memory_plan
                lines.append(f"KV cache {plan.kv_bytes_per_token / 1e3:.1f} kB per token ({plan.kv_dtype}); "
                             + "; ".join(f"{t.name}: " + (f"up to {t.max_batch_at_context} sequences of {plan.context} "
                                                          f"tokens" if not t.spills else "would offload")
                                         for t in plan.tiers) + ".")
    protocols = list(dict.fromkeys(f"{e.name}: {e.protocol}" for r in rows if r.lm for e in r.lm.evals if e.protocol))
    if protocols:
        lines += ["", "Protocols:", *[f"- {_text(p_, 400)}" for p_ in protocols]]
    notes = [n for r in rows for n in r.notes] + [n for n in report.notes if "GGUF" in n]
    if notes:
        lines += ["", *[f"- {_text(n)}" for n in notes]]
    cpu = m.hardware["cpu"]
    lines += ["", f"Baseline: `{_code(report.budget.baseline)}`. Machine: {_text(cpu.get('model'))} "
              f"({m.threads} threads). compress {_text(m.versions.get('compress', '?'))}, run started "
              f"{_text(m.started or '?')}."]
    lines += ["", "## Use", "", *_lm_usage(fmt)]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=False, width=1000)
    return f"---\n{front}---\n\n" + "\n".join(lines) + "\n"


def _lm_usage(fmt: str | None) -> list[str]:
    if fmt == "onnx":
        return ["```python", "from optimum.onnxruntime import ORTModelForCausalLM",
                "from transformers import AutoTokenizer, pipeline",
                'gen = pipeline("text-generation", model=ORTModelForCausalLM.from_pretrained("."),'
                ' tokenizer=AutoTokenizer.from_pretrained("."))', "```"]
    if fmt == "hf":
        return ["```python", "from transformers import pipeline", 'gen = pipeline("text-generation", model=".")', "```"]
    return [f"Load with `compress.formats.load_predictor({fmt!r}, path, 'cpu', threads, causal=True)`."]


def _usage(fmt: str | None) -> list[str]:
    if fmt == "onnx":
        return ["```python", "from optimum.onnxruntime import ORTModelForSequenceClassification",
                "from transformers import AutoTokenizer, pipeline",
                'clf = pipeline("text-classification", model=ORTModelForSequenceClassification.from_pretrained("."),'
                ' tokenizer=AutoTokenizer.from_pretrained("."))', "```"]
    if fmt == "hf":
        return ["```python", "from transformers import pipeline", 'clf = pipeline("text-classification", model=".")',
                "```"]
    if fmt == "cascade":
        return ["This folder names its two members (`cascade.json`, paths relative to the run folder): share the "
                "run folder, or deploy the members with the routing rule (the small member answers when its top "
                "probability reaches the threshold)."]
    return [f"Load with `compress.formats.load_predictor({fmt!r}, path, 'cpu', threads)` (the `{fmt}` format "
            "needs compress's loader)."]


def write_model_cards(report: "Report | dict", run_dir: Path) -> list[Path]:
    """A README.md in every measured variant's folder inside the run folder (the recipe's
    own model, elsewhere, is left alone). Each is written atomically. Returns the paths."""
    written = []
    report = as_report(report)
    run_dir = Path(run_dir)
    for variant in dict.fromkeys(r.id for r in report.rows):
        folder = run_dir / variant
        # A folder that is a link (to a folder elsewhere, or to another variant's) is no output of this run.
        if folder.is_symlink() or not (folder / MARKER).is_file() or folder.resolve().parent != run_dir.resolve():
            continue
        path = folder / MODEL_CARD
        # The temporary lies outside the folder: a leftover is no output file.
        write_file(path, card(report, variant), tmp=run_dir / f".{variant}.{MODEL_CARD}.part")
        written.append(path)
    return written
