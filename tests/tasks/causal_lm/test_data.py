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


# --- Hostile eval files (issue "Hostile inputs, third round", item 2): every fault is one
# DataError naming the file and the line, never a KeyError or UnicodeDecodeError (exit 1).

ARC_OK = {"id": "q9", "question": {"stem": "s", "choices": [{"text": "a", "label": "A"}, {"text": "b", "label": "B"}]},
          "answerKey": "A"}


def _jsonl_bytes(*rows) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


@pytest.mark.parametrize("file, content, needles", [
    ("wikitext2/wiki.test.raw", b"", ["wiki.test.raw", "empty"]),
    ("wikitext2/wiki.test.raw", b" \r\n \r\n", ["wiki.test.raw", "empty"]),
    ("wikitext2/wiki.test.raw", b"first line\r\n\x00\x01\x02\xff", ["wiki.test.raw", "line 2", "binary"]),
    ("wikitext2/wiki.test.raw", b"caf\xe9\r\nok\r\n", ["wiki.test.raw", "line 1", "not UTF-8"]),
    ("arc_easy/dev.jsonl", _jsonl_bytes(ARC_OK, b"{not json"), ["dev.jsonl", "line 2", "not JSON"]),
    ("arc_easy/dev.jsonl", _jsonl_bytes(ARC_OK, [1, 2]), ["dev.jsonl", "line 2", "not an object"]),
    ("arc_easy/dev.jsonl", _jsonl_bytes({"id": "q1", "answerKey": "A"}), ["dev.jsonl", "line 1", "'question'"]),
    ("arc_easy/dev.jsonl", _jsonl_bytes({**ARC_OK, "question": {"stem": "s", "choices": "AB"}}),
     ["dev.jsonl", "line 1", "'choices'"]),
    ("arc_easy/dev.jsonl", _jsonl_bytes({**ARC_OK, "answerKey": "E"}), ["dev.jsonl", "line 1", "answerKey 'E'"]),
    ("arc_easy/dev.jsonl", _jsonl_bytes({**ARC_OK, "question": {"stem": 3, "choices": []}}), ["dev.jsonl", "line 1", "'stem'"]),
    ("arc_easy/dev.jsonl", b"\xff\xfe{}\n", ["dev.jsonl", "line 1", "not UTF-8"]),
    ("arc_easy/dev.jsonl", b"\n\n", ["dev.jsonl", "empty"]),
    ("piqa/dev-labels.lst", b"0\n2\n", ["dev-labels.lst", "line 2", "not 0 or 1"]),
    ("piqa/dev-labels.lst", b"0\nyes\n", ["dev-labels.lst", "line 2", "not 0 or 1"]),
    ("piqa/dev-labels.lst", b"0\n1\n1\n", ["dev-labels.lst", "3 labels for the 2 questions"]),
    ("piqa/dev-labels.lst", b"", ["dev-labels.lst", "empty"]),
    ("piqa/dev.jsonl", _jsonl_bytes({"id": "p1", "goal": "g", "sol1": "a"}, {"id": "p2", "goal": "g", "sol1": "a", "sol2": "b"}),
     ["piqa/dev.jsonl", "line 1", "'sol2'"]),
    ("samsum/validation.jsonl", _jsonl_bytes({"id": "1", "summary": "s"}), ["validation.jsonl", "line 1", "'dialogue'"]),
    ("samsum/validation.jsonl", _jsonl_bytes({"id": "1", "dialogue": "d", "summary": "s"}, b'{"id": "2", "dialogue": "caf\xe9"}'),
     ["validation.jsonl", "line 2", "not UTF-8"]),
    ("samsum/validation.jsonl", _jsonl_bytes({"id": True, "dialogue": "d", "summary": "s"}), ["validation.jsonl", "line 1", "'id'"]),
    ("samsum/train.jsonl", _jsonl_bytes({"id": "t1", "dialogue": ["Ann: hi"]}), ["train.jsonl", "line 1", "'dialogue'"]),
    ("samsum/train.jsonl", b"\x00" * 64, ["train.jsonl", "line 1", "binary"]),
])
def test_a_broken_eval_file_is_one_line_naming_the_file_and_the_line(data: Path, file, content, needles):
    (data.parent / "data" / file).write_bytes(content)
    s = spec(multiple_choice=[{"name": "arc_easy", "path": "../data/arc_easy"}, {"name": "piqa", "path": "../data/piqa"}])
    with pytest.raises(DataError) as exc:
        load_lm_evals(s, data)
    message = str(exc.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_an_eval_file_that_is_a_symlink_loop_says_so(data: Path):
    wiki = data.parent / "data" / "wikitext2" / "wiki.test.raw"
    wiki.unlink()
    wiki.symlink_to(wiki)
    with pytest.raises(DataError, match="symlink loop"):
        load_lm_evals(spec(), data)


def test_a_bom_and_integer_ids_are_read(data: Path):
    path = data.parent / "data" / "samsum" / "validation.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _jsonl_bytes({"id": 7, "dialogue": "Ann: hi", "summary": "Ann says hi."},
                                                   {"id": 8, "dialogue": "Bob: yo", "summary": "Bob says yo."}))
    assert [r["id"] for r in load_lm_evals(spec(), data).of("samsum")] == ["7", "8"]


def test_timing_prompts_without_a_summarization_block_name_their_own_key(tmp_path: Path, data: Path):
    """A recipe that names no SAMSum file: the prompts' default source is not there, and the
    error says which key sets it; lm.timing.path names any dialogue file."""
    elsewhere = tmp_path / "elsewhere" / "recipes"
    elsewhere.mkdir(parents=True)
    (elsewhere.parent / "data").symlink_to(data.parent / "data")
    lone = {"perplexity": {"path": "../data/wikitext2/wiki.test.raw", "max_windows": 3}, "timing": {"prompts": 2}}
    with pytest.raises(DataError, match=r"^lm\.timing\.path: the timing prompts are drawn from SAMSum dialogues"):
        load_lm_evals(LMSpec.model_validate(lone), elsewhere)
    own = LMSpec.model_validate({**lone, "timing": {"prompts": 2, "path": "../data/samsum/validation.jsonl"}})
    es = load_lm_evals(own, elsewhere)
    assert [r["id"] for r in es.of("prompt")] == ["0", "1"] and not es.of("samsum")
    with pytest.raises(DataError, match=r"lm\.timing\.path: .*nothing\.jsonl not found"):
        load_lm_evals(LMSpec.model_validate({**lone, "timing": {"path": "../data/nothing.jsonl"}}), elsewhere)
