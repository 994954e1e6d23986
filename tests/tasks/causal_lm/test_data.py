"""Reading the causal-LM evals from the files the recipe's `lm` block names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compress.core.errors import DataError
from compress.tasks.causal_lm.data import load_lm_evals
from compress.tasks.causal_lm.records import LMSpec

SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"


def _write(folder: Path, rows: list[dict]) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    (d / "wikitext2").mkdir(parents=True)
    (d / "wikitext2" / "wiki.test.raw").write_bytes(b" = Title = \r\n First line .\r\n Second line .\r\n")
    _write(d / "arc_easy" / "dev.jsonl", [
        {"id": "q1", "question": {"stem": "Which is a metal?", "choices": [
            {"text": "wood", "label": "A", "para": "x"}, {"text": "iron", "label": "B", "para": "y"}]},
         "answerKey": "B"},
        {"id": "q2", "question": {"stem": "Pick 3", "choices": [{"text": "one", "label": "1"}, {"text": "two", "label": "2"},
                                                                 {"text": "three", "label": "3"}]}, "answerKey": "3"}])
    _write(d / "piqa" / "dev.jsonl", [{"id": "p1", "goal": "Open a jar", "sol1": "twist the lid", "sol2": "eat it"},
                                      {"id": "p2", "goal": "Dry hair", "sol1": "wet it", "sol2": "use a towel"}])
    (d / "piqa" / "dev-labels.lst").write_text("0\n1\n")
    dialogues = [{"id": str(i), "dialogue": f"Ann: hi {i}\r\nBob: bye {i}", "summary": f"Ann and Bob {i}."}
                 for i in range(6)]
    _write(d / "samsum" / "validation.jsonl", dialogues)
    _write(d / "samsum" / "train.jsonl", [{**x, "id": "t" + x["id"]} for x in dialogues])
    (tmp_path / "recipes").mkdir()
    return tmp_path / "recipes"


def spec(**over) -> LMSpec:
    base = {"perplexity": {"path": "../data/wikitext2/wiki.test.raw", "max_windows": 3},
            "multiple_choice": [{"name": "arc_easy", "path": "../data/arc_easy"},
                                {"name": "piqa", "path": "../data/piqa", "max_items": 1}],
            "summarization": {"path": "../data/samsum/validation.jsonl", "max_items": 2},
            "timing": {"prompts": 3}}
    return LMSpec.model_validate({**base, **over})


def test_rows(data: Path):
    es = load_lm_evals(spec(), data)
    text = es.of("perplexity")[0]["text"]
    assert text == " = Title = \n\n First line .\n\n Second line ."  # CRLF lines joined with a blank line
    arc = es.of("arc_easy")
    assert arc[0] == {"eval": "arc_easy", "id": "q1", "context": "Question: Which is a metal?\nAnswer:",
                      "choices": ["wood", "iron"], "gold": 1}
    assert arc[1]["gold"] == 2 and len(arc) == 2
    assert es.of("piqa") == [{"eval": "piqa", "id": "p1", "context": "Question: Open a jar\nAnswer:",
                              "choices": ["twist the lid", "eat it"], "gold": 0}]
    sam = es.of("samsum")
    assert [r["id"] for r in sam] == ["0", "1"]
    assert sam[0]["prompt"] == "Summarize this dialogue:\nAnn: hi 0\nBob: bye 0" and sam[0]["summary"] == "Ann and Bob 0."
    prompts = es.of("prompt")
    assert [r["id"] for r in prompts] == ["t0", "t1", "t2"]  # from train: never a scored dialogue
    assert es.describe()["arc_easy"]["items"] == 2 and es.describe()["piqa"]["items"] == 1
    json.dumps(es.rows)  # every row goes to the worker's eval file


def test_fingerprint_follows_settings_and_data(data: Path):
    a = load_lm_evals(spec(), data).fingerprint
    assert load_lm_evals(spec(), data).fingerprint == a
    assert load_lm_evals(spec(perplexity={"path": "../data/wikitext2/wiki.test.raw", "max_windows": 4}),
                         data).fingerprint != a
    (data.parent / "data" / "piqa" / "dev-labels.lst").write_text("1\n1\n")
    assert load_lm_evals(spec(), data).fingerprint != a


def test_prompts_from_validation_without_train(data: Path):
    (data.parent / "data" / "samsum" / "train.jsonl").unlink()
    es = load_lm_evals(spec(), data)
    assert [r["id"] for r in es.of("prompt")] == ["2", "3", "4"]  # past the two scored dialogues
    assert any("validation dialogues 2..4" in n for n in es.notes)


def test_missing_files_name_the_key(data: Path):
    bad = spec(multiple_choice=[{"name": "arc_easy", "path": "../data/nowhere"}])
    with pytest.raises(DataError, match=r"lm\.multiple_choice\[0\]\.path"):
        load_lm_evals(bad, data)
    with pytest.raises(DataError, match=r"lm\.perplexity\.path"):
        load_lm_evals(spec(perplexity={"path": "../data/none.raw"}), data)
    with pytest.raises(DataError, match="lower lm.timing.prompts"):
        load_lm_evals(spec(timing={"prompts": 10}), data)
    (data.parent / "data" / "piqa" / "dev-labels.lst").unlink()
    with pytest.raises(DataError, match=r"lm\.multiple_choice\[1\]\.path: .*dev-labels\.lst not found"):
        load_lm_evals(spec(), data)


@pytest.mark.skipif(not (SHARED / "arc_easy" / "dev.jsonl").is_file(), reason="the shared data is not here")
def test_shared_data_counts():
    es = load_lm_evals(LMSpec.model_validate({
        "perplexity": {"path": str(SHARED / "wikitext2" / "wiki.test.raw")},
        "multiple_choice": [{"name": "arc_easy", "path": str(SHARED / "arc_easy")},
                            {"name": "piqa", "path": str(SHARED / "piqa")}],
        "summarization": {"path": str(SHARED / "samsum" / "validation.jsonl"), "max_items": 818}}), Path("/"))
    assert (len(es.of("arc_easy")), len(es.of("piqa")), len(es.of("samsum"))) == (570, 1838, 818)
    assert all(r["gold"] in (0, 1) for r in es.of("piqa"))
