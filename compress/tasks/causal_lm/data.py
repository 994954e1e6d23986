"""The evaluation data of a causal LM, read from the files the recipe's `lm` block names:
WikiText-2 raw text (perplexity), ARC-Easy and PIQA (zero-shot multiple choice, as
lm-evaluation-harness poses them), SAMSum (dialogue summarisation), and the real prompts
generation is timed on.

Everything is turned into JSON rows (one per scored item, each with an `eval` key naming its
set) that the benchmark worker reads from its eval file; tokenization is left to the task,
since every variant brings its own tokenizer. Text only here: no framework is imported.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from compress.core.errors import DataError
from compress.tasks.causal_lm.records import LMSpec, SummarySpec

# The zero-shot prompts of lm-evaluation-harness (tasks/arc/arc_easy.yaml, tasks/piqa/piqa.yaml):
# doc_to_text, and the target delimiter put before every choice.
MC_TEMPLATE = "Question: {question}\nAnswer:"
MC_DELIMITER = " "
# The user turn of a summarisation request; the variant's chat template wraps it.
SUMMARY_PROMPT = "Summarize this dialogue:\n{dialogue}"
# Train dialogues the timing prompts are drawn from (the first ones; never scored).
PROMPT_SOURCE = "train.jsonl"


class LMEvalSet(BaseModel):
    """The rows of every eval, what they were read from, and a fingerprint of what is scored."""

    model_config = ConfigDict(extra="forbid")

    rows: list[dict[str, Any]]
    fingerprint: str  # sha256 of the rows and the scoring settings
    sources: dict[str, dict[str, Any]]  # eval name -> {"path", "items", ...} for the report manifest
    notes: list[str] = []

    def describe(self) -> dict[str, dict[str, Any]]:
        """What the report manifest records of the data: per eval, its file and item count."""
        return {name: dict(info) for name, info in self.sources.items()}

    def of(self, name: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["eval"] == name]

    # What the runner, the stages and the benchmark read of a run's data (compress.tasks.classification.data.Data
    # for classifiers): the eval rows and their fingerprint; stages see the timing prompts.
    @property
    def eval(self) -> "LMEvalSet":
        return self

    @property
    def eval_fingerprint(self) -> str:
        return self.fingerprint

    @property
    def train_fingerprint(self) -> str:
        """What a stage's output may depend on (its parity prompts): the timing prompts only,
        so that changing what is scored re-measures every variant but rebuilds none."""
        import hashlib
        import json

        return hashlib.sha256(json.dumps(self.prompts(), ensure_ascii=False).encode()).hexdigest()

    def prompts(self, n: int | None = None) -> list[str]:
        """Real prompts, plain user messages (the model's chat template is applied at use):
        parity checks and timing. The first `n` (all: None)."""
        found = [r["prompt"] for r in self.rows if r["eval"] == "prompt"]
        return found if n is None else found[:n]

    id2label: None = None  # no classes

    def summary(self) -> str:
        parts = [f"{name} {info['items']} items" if "items" in info else
                 f"{name} ({', '.join(f'{k} {v}' for k, v in info.items() if k != 'path')})"
                 for name, info in self.sources.items()]
        return ", ".join(parts)


def _file(base_dir: Path, rel: str, key: str, name: str = "") -> Path:
    path = (base_dir / rel / name) if name else (base_dir / rel)
    if not path.is_file():
        raise DataError(f"{key}: {path} not found; point {key} at the folder or file that holds it")
    return path


def _jsonl(path: Path, key: str, limit: int | None = None) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{key}: {path} line {n} is not JSON ({exc.msg}); it must be JSON Lines") from exc
            if limit is not None and len(rows) >= limit:
                break
    return rows


def wikitext_text(path: Path) -> str:
    """The file's lines (CRLF) joined with a blank line between them, as the Hugging Face
    perplexity recipe joins the split's rows."""
    lines = path.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
    while lines and not lines[-1]:
        lines.pop()
    return "\n\n".join(lines)


def arc_rows(path: Path, key: str, max_items: int | None) -> list[dict]:
    rows = []
    for doc in _jsonl(path, key, max_items):
        try:
            q = doc["question"]
            labels = [c["label"] for c in q["choices"]]
            rows.append({"eval": "arc_easy", "id": doc["id"], "context": MC_TEMPLATE.format(question=q["stem"]),
                         "choices": [c["text"] for c in q["choices"]], "gold": labels.index(doc["answerKey"])})
        except (KeyError, ValueError, TypeError) as exc:
            raise DataError(f"{key}: {path} row {doc.get('id', '?')} is not an ARC question "
                                f"({exc.__class__.__name__}: {exc})") from exc
    return rows


def piqa_rows(folder: Path, key: str, max_items: int | None) -> list[dict]:
    docs = _jsonl(_file(folder, "dev.jsonl", key), key, max_items)
    labels = _file(folder, "dev-labels.lst", key).read_text().split()
    if len(labels) < len(docs):
        raise DataError(f"{key}: {folder}/dev-labels.lst has {len(labels)} labels for {len(docs)} questions")
    return [{"eval": "piqa", "id": d["id"], "context": MC_TEMPLATE.format(question=d["goal"]),
             "choices": [d["sol1"], d["sol2"]], "gold": int(labels[i])} for i, d in enumerate(docs)]


def summary_prompt(dialogue: str) -> str:
    """The user message asking for a summary (turns separated by newlines, not CRLF)."""
    return SUMMARY_PROMPT.format(dialogue=dialogue.replace("\r\n", "\n").strip())


def load_lm_evals(spec: LMSpec, base_dir: Path) -> LMEvalSet:
    """Reads every eval the spec names (paths relative to `base_dir`, the recipe's folder)."""
    base_dir = Path(base_dir)
    rows: list[dict] = []
    sources: dict[str, dict] = {}
    notes: list[str] = []

    ppl = spec.perplexity
    path = _file(base_dir, ppl.path, "lm.perplexity.path")
    text = wikitext_text(path)
    rows.append({"eval": "perplexity", "text": text})
    sources["perplexity"] = {"path": str(path), "chars": len(text), "context": ppl.context, "stride": ppl.stride,
                             "max_windows": ppl.max_windows}

    for i, mc in enumerate(spec.multiple_choice):
        key = f"lm.multiple_choice[{i}].path"
        folder = base_dir / mc.path
        if mc.name == "arc_easy":
            items = arc_rows(_file(folder, "dev.jsonl", key) if folder.is_dir() else _file(base_dir, mc.path, key),
                             key, mc.max_items)
        else:
            if not folder.is_dir():
                raise DataError(f"{key}: {folder} is not a folder; point it at the PIQA folder "
                                    f"(dev.jsonl and dev-labels.lst)")
            items = piqa_rows(folder, key, mc.max_items)
        if not items:
            raise DataError(f"{key}: {folder} holds no questions")
        rows.extend(items)
        sources[mc.name] = {"path": str(folder), "items": len(items), "template": MC_TEMPLATE,
                            "delimiter": MC_DELIMITER}

    summ = spec.summarization
    if summ is not None:
        key = "lm.summarization.path"
        path = _file(base_dir, summ.path, key)
        docs = _jsonl(path, key, summ.max_items)
        for d in docs:
            rows.append({"eval": "samsum", "id": str(d["id"]), "prompt": summary_prompt(d["dialogue"]),
                         "summary": d["summary"]})
        sources["samsum"] = {"path": str(path), "items": len(docs), "prompt": SUMMARY_PROMPT,
                             "max_new_tokens": summ.max_new_tokens}

    rows.extend(timing_prompts(spec, base_dir, notes))
    sources["prompts"] = {"items": spec.timing.prompts, "new_tokens": spec.timing.new_tokens,
                          "batch_sizes": spec.timing.batch_sizes, "max_prompt_tokens": spec.timing.max_prompt_tokens}

    digest = hashlib.sha256()
    digest.update(json.dumps(spec.model_dump(mode="json", exclude={"memory_tiers"}), sort_keys=True).encode())
    for r in rows:
        digest.update(json.dumps(r, sort_keys=True, ensure_ascii=False).encode())
    return LMEvalSet(rows=rows, fingerprint=digest.hexdigest(), sources=sources, notes=notes)


def timing_prompts(spec: LMSpec, base_dir: Path, notes: list[str]) -> list[dict]:
    """Real prompts for the generation timings: chat requests to summarise SAMSum train
    dialogues (never scored), else validation dialogues past the scored ones."""
    n = spec.timing.prompts
    summ_path = (spec.summarization or SummarySpec()).path
    folder = (base_dir / summ_path).parent
    train = folder / PROMPT_SOURCE
    if train.is_file():
        docs = _jsonl(train, "lm.summarization.path", n)
    else:
        val = _file(base_dir, summ_path, "lm.summarization.path")
        skip = spec.summarization.max_items if spec.summarization is not None else 0
        docs = _jsonl(val, "lm.summarization.path", skip + n)[skip:]
        notes.append(f"timing prompts: {train} not found; validation dialogues {skip}..{skip + len(docs) - 1} used")
    if len(docs) < n:
        raise DataError(f"lm.timing.prompts: {n} prompts asked for, {len(docs)} dialogues found beside "
                            f"{folder}; lower lm.timing.prompts")
    return [{"eval": "prompt", "id": str(d["id"]), "prompt": summary_prompt(d["dialogue"])} for d in docs]

