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
import os
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
NEWLINE = b"\n"


class LMEvalSet(BaseModel):
    """The rows of every eval, what they were read from, and a fingerprint of what is scored."""

    model_config = ConfigDict(extra="forbid")

    rows: list[dict[str, Any]]
    fingerprint: str  # sha256 of the rows and the scoring settings
    sources: dict[str, dict[str, Any]]  # eval name -> {"path", "items", ...} for the report manifest
    notes: list[str] = []
    # eval name -> the line in its file of each of its rows, in order (samsum, prompt): for
    # errors found once a tokenizer is at hand; not part of the fingerprint.
    lines: dict[str, list[int]] = {}

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
        if path.is_symlink() and not path.exists():  # a loop or a dangling link is not a missing file
            try:
                path.stat()
            except OSError as exc:
                import errno

                if exc.errno == errno.ELOOP:
                    raise DataError(f"{key}: {path} is a symlink loop (a link that leads back to itself); "
                                    f"point {key} at a real file") from exc
            raise DataError(f"{key}: {path} is a symlink to '{os.readlink(path)}', which does not exist")
        raise DataError(f"{key}: {path} not found; point {key} at the folder or file that holds it")
    return path


def _decode(raw: bytes, path: Path, key: str, line: int, offset: int = 0) -> str:
    """One line (or a whole file) of UTF-8 text; a binary or non-UTF-8 file is its error, naming the line."""
    if b"\x00" in raw:
        at = line + raw.count(NEWLINE, 0, raw.index(b"\x00"))
        raise DataError(f"{key}: {path} line {at}: a NUL byte; this is a binary file, "
                        f"not UTF-8 text")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = line + raw.count(NEWLINE, 0, exc.start)
        raise DataError(f"{key}: {path} line {at}: not UTF-8 text (byte "
                        f"0x{raw[exc.start]:02x} at offset {offset + exc.start}); re-encode the file as UTF-8") from exc


def _read_text(path: Path, key: str) -> str:
    """A whole text file, checked: readable, UTF-8 (a leading BOM dropped), not binary, not empty."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{key}: cannot read {path} ({exc.strerror or exc.__class__.__name__})") from exc
    text = _decode(raw, path, key, 1).removeprefix("\ufeff")
    if not text.strip():
        raise DataError(f"{key}: {path} is empty; point {key} at a file that holds the data")
    return text


def _jsonl(path: Path, key: str, limit: int | None = None) -> list[tuple[int, dict]]:
    """(line number, object) of the first `limit` rows of a JSON Lines file (blank lines
    skipped). Every fault is a DataError naming the file and the line: bytes that are not
    UTF-8 text, a line that is not JSON or not a JSON object, a file without rows."""
    rows: list[tuple[int, dict]] = []
    offset = 0
    try:
        with path.open("rb") as fh:
            for n, raw in enumerate(fh, 1):
                line = _decode(raw, path, key, n, offset)
                offset += len(raw)
                if n == 1:
                    line = line.removeprefix("\ufeff")
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as exc:
                    why = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                    raise DataError(f"{key}: {path} line {n} is not JSON ({why}); it must be JSON Lines") from exc
                if not isinstance(doc, dict):
                    raise DataError(f"{key}: {path} line {n} is a JSON {type(doc).__name__}, not an object; each line "
                                    f"must be one JSON object")
                rows.append((n, doc))
                if limit is not None and len(rows) >= limit:
                    break
    except OSError as exc:
        raise DataError(f"{key}: cannot read {path} ({exc.strerror or exc.__class__.__name__})") from exc
    if not rows:
        raise DataError(f"{key}: {path} is empty (no JSON rows); point {key} at a file that holds the data")
    return rows


def _field(doc: dict, name: str, where: str, kind: type | tuple = str) -> Any:
    """doc[name], which must be of `kind` (bool is never an int here); DataError naming the row."""
    if name not in doc:
        raise DataError(f"{where}: no '{name}' field (fields: {', '.join(map(str, list(doc)[:8])) or 'none'})")
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        want = "text" if kind is str else "a list" if kind is list else "an object" if kind is dict else "text or a number"
        raise DataError(f"{where}: '{name}' is {str(json.dumps(value))[:40]}, not {want}")
    return value


def _row_id(doc: dict, where: str) -> str:
    return str(_field(doc, "id", where, (str, int)))


def wikitext_text(path: Path, key: str = "lm.perplexity.path") -> str:
    """The file's lines (CRLF) joined with a blank line between them, as the Hugging Face
    perplexity recipe joins the split's rows."""
    lines = _read_text(path, key).replace("\r\n", "\n").split("\n")
    while lines and not lines[-1]:
        lines.pop()
    return "\n\n".join(lines)


def arc_rows(path: Path, key: str, max_items: int | None) -> list[dict]:
    rows = []
    for n, doc in _jsonl(path, key, max_items):
        where = f"{key}: {path} line {n}"
        qid = _row_id(doc, where)
        where = f"{key}: {path} line {n} (question {qid[:40]})"
        q = _field(doc, "question", where, dict)
        stem = _field(q, "stem", f"{where}: question")
        choices = _field(q, "choices", f"{where}: question", list)
        if len(choices) < 2:
            raise DataError(f"{where}: {len(choices)} choice(s); a multiple-choice question needs two or more")
        texts, labels = [], []
        for j, c in enumerate(choices):
            if not isinstance(c, dict):
                raise DataError(f"{where}: choice {j + 1} is not an object with 'text' and 'label'")
            texts.append(_field(c, "text", f"{where}: choice {j + 1}"))
            labels.append(str(_field(c, "label", f"{where}: choice {j + 1}", (str, int))))
        if len(set(labels)) != len(labels):
            raise DataError(f"{where}: the choices' labels ({', '.join(labels)}) repeat one; each names one choice")
        answer = str(_field(doc, "answerKey", where, (str, int)))
        if answer not in labels:  # scored as always wrong otherwise
            raise DataError(f"{where}: answerKey '{answer[:20]}' is not one of the choices' labels ({', '.join(labels)})")
        rows.append({"eval": "arc_easy", "id": qid, "context": MC_TEMPLATE.format(question=stem),
                     "choices": texts, "gold": labels.index(answer)})
    return rows


def piqa_rows(folder: Path, key: str, max_items: int | None) -> list[dict]:
    dev = _file(folder, "dev.jsonl", key)
    docs = _jsonl(dev, key, max_items)
    label_file = _file(folder, "dev-labels.lst", key)
    lines = _read_text(label_file, key).replace("\r\n", "\n").split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    labels = []
    for n, text in enumerate(lines, 1):
        if text.strip() not in ("0", "1"):  # two solutions: any other label is scored as always wrong
            raise DataError(f"{key}: {label_file} line {n}: label {text.strip()[:20]!r} is not 0 or 1 (PIQA's two "
                            f"solutions, sol1 and sol2)")
        labels.append(int(text))
    read_all = max_items is None or len(docs) < max_items
    if len(labels) < len(docs) or (read_all and len(labels) != len(docs)):
        raise DataError(f"{key}: {label_file} has {len(labels)} labels for the {len(docs)} questions of {dev}; "
                        f"they must pair up line by line")
    rows = []
    for i, (n, d) in enumerate(docs):
        where = f"{key}: {dev} line {n}"
        rows.append({"eval": "piqa", "id": _row_id(d, where), "context": MC_TEMPLATE.format(question=_field(d, "goal", where)),
                     "choices": [_field(d, "sol1", where), _field(d, "sol2", where)], "gold": labels[i]})
    return rows


def dialogue_rows(path: Path, key: str, limit: int | None, summaries: bool = True) -> list[tuple[int, dict]]:
    """(line number, {"id", "dialogue"[, "summary"]}) of SAMSum rows, each field checked."""
    out = []
    for n, d in _jsonl(path, key, limit):
        where = f"{key}: {path} line {n}"
        row = {"id": _row_id(d, where), "dialogue": _field(d, "dialogue", where)}
        if summaries:
            row["summary"] = _field(d, "summary", where)
        out.append((n, row))
    return out


def summary_prompt(dialogue: str) -> str:
    """The user message asking for a summary (turns separated by newlines, not CRLF)."""
    return SUMMARY_PROMPT.format(dialogue=dialogue.replace("\r\n", "\n").strip())


def load_lm_evals(spec: LMSpec, base_dir: Path) -> LMEvalSet:
    """Reads every eval the spec names (paths relative to `base_dir`, the recipe's folder)."""
    base_dir = Path(base_dir)
    rows: list[dict] = []
    sources: dict[str, dict] = {}
    notes: list[str] = []
    lines: dict[str, list[int]] = {}

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
        docs = dialogue_rows(path, key, summ.max_items)
        for n, d in docs:
            rows.append({"eval": "samsum", "id": d["id"], "prompt": summary_prompt(d["dialogue"]),
                         "summary": d["summary"]})
            lines.setdefault("samsum", []).append(n)
        sources["samsum"] = {"path": str(path), "items": len(docs), "prompt": SUMMARY_PROMPT,
                             "max_new_tokens": summ.max_new_tokens}

    prompts, prompt_src, prompt_lines = _timing_prompts(spec, base_dir, notes)
    rows.extend(prompts)
    lines["prompt"] = prompt_lines
    sources["prompts"] = {"path": str(prompt_src), "items": spec.timing.prompts, "new_tokens": spec.timing.new_tokens,
                          "batch_sizes": spec.timing.batch_sizes, "max_prompt_tokens": spec.timing.max_prompt_tokens}

    digest = hashlib.sha256()
    digest.update(json.dumps(spec.model_dump(mode="json", exclude={"memory_tiers"}), sort_keys=True).encode())
    for r in rows:
        digest.update(json.dumps(r, sort_keys=True, ensure_ascii=False).encode())
    return LMEvalSet(rows=rows, fingerprint=digest.hexdigest(), sources=sources, notes=notes, lines=lines)


def timing_prompts(spec: LMSpec, base_dir: Path, notes: list[str]) -> list[dict]:
    """Real prompts for the generation timings: chat requests to summarise SAMSum train
    dialogues (never scored), else validation dialogues past the scored ones."""
    return _timing_prompts(spec, base_dir, notes)[0]


def _timing_prompts(spec: LMSpec, base_dir: Path, notes: list[str]) -> tuple[list[dict], Path, list[int]]:
    """(the prompt rows, the file they came from, each one's line in it)."""
    n = spec.timing.prompts
    if spec.timing.path is not None:  # the user's own dialogues: nothing else is looked for
        src = _file(base_dir, spec.timing.path, "lm.timing.path")
        docs = dialogue_rows(src, "lm.timing.path", n, summaries=False)
        if len(docs) < n:
            raise DataError(f"lm.timing.prompts: {n} prompts asked for, {len(docs)} dialogues in {src}; "
                            f"lower lm.timing.prompts")
        rows = [{"eval": "prompt", "id": d["id"], "prompt": summary_prompt(d["dialogue"])} for _, d in docs]
        return rows, src, [line for line, _ in docs]
    summ_path = (spec.summarization or SummarySpec()).path
    folder = (base_dir / summ_path).parent
    train = folder / PROMPT_SOURCE
    # Without a summarization block the SAMSum path is only a default the recipe never
    # named: a missing file must say which key sets the prompts' source.
    key = "lm.summarization.path" if spec.summarization is not None else "lm.timing.path"
    if spec.summarization is None and not train.is_file() and not (base_dir / summ_path).is_file():
        raise DataError(f"lm.timing.path: the timing prompts are drawn from SAMSum dialogues, and {train} is not "
                        f"there; set lm.timing.path to a JSON Lines file of {{\"id\", \"dialogue\"}} rows")
    if train.is_file():
        src = train
        docs = dialogue_rows(train, key, n, summaries=False)
    else:
        src = _file(base_dir, summ_path, key)
        skip = spec.summarization.max_items if spec.summarization is not None else 0
        docs = dialogue_rows(src, key, skip + n, summaries=False)[skip:]
        notes.append(f"timing prompts: {train} not found; validation dialogues {skip}..{skip + len(docs) - 1} used")
    if len(docs) < n:
        raise DataError(f"lm.timing.prompts: {n} prompts asked for, {len(docs)} dialogues found beside "
                            f"{folder}; lower lm.timing.prompts")
    rows = [{"eval": "prompt", "id": d["id"], "prompt": summary_prompt(d["dialogue"])} for _, d in docs]
    return rows, src, [line for line, _ in docs]
