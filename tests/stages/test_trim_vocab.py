import json

import numpy as np
import pytest
import torch

from compress.core.errors import RecipeError
from compress.recipe.schema import validate_recipe
from compress.run.runner import run_recipe
from tests.conftest import NEG, NOUNS, POS, run_stage, tiny_recipe

torch.set_num_threads(1)

IN_VOCAB = ["the movie was great", "the plot was dull acting cast script", "the ending was wonderful film story"]


@pytest.fixture(scope="module")
def trimmed(tiny_classifier, tiny_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("trimmed") / "out"
    result = run_stage(tiny_classifier, tiny_data, out, "trim_vocab", {"keep": ["zebra", "[unused5]"]})
    return out, result


def test_vocabulary_and_parameters_shrink(tiny_classifier, trimmed):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out, result = trimmed
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True)
    corpus_words = {"the", "was", *POS, *NEG, *NOUNS}
    assert result.vocab_before == 30522 and result.vocab_after == len(tok) < 200
    assert model.get_input_embeddings().weight.shape == (len(tok), 32) and model.config.vocab_size == len(tok)
    assert result.params_after == sum(p.numel() for p in model.parameters()) < result.params_before
    assert (out / "model.safetensors").stat().st_size < (tiny_classifier / "model.safetensors").stat().st_size / 10
    vocab = tok.get_vocab()
    assert corpus_words <= set(vocab) and {"[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"} <= set(vocab)
    assert "zebra" in vocab and "[unused5]" in vocab  # the keep list
    assert "cinema" not in vocab
    assert result.eval_tokens_dropped == 0.0  # the synthetic eval split uses the training words


def test_in_vocabulary_text_tokenizes_alike_and_gives_the_same_logits(tiny_classifier, trimmed):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out, _ = trimmed
    old_tok, new_tok = AutoTokenizer.from_pretrained(tiny_classifier), AutoTokenizer.from_pretrained(out)
    old_vocab, new_vocab = old_tok.get_vocab(), new_tok.get_vocab()
    a = old_tok(IN_VOCAB, padding=True, return_tensors="pt")
    b = new_tok(IN_VOCAB, padding=True, return_tensors="pt")
    assert [old_tok.convert_ids_to_tokens(x) for x in a["input_ids"]] == \
        [new_tok.convert_ids_to_tokens(x) for x in b["input_ids"]]
    assert not torch.equal(a["input_ids"], b["input_ids"])  # renumbered
    assert all(new_vocab[t] < old_vocab[t] or new_vocab[t] == old_vocab[t] == 0 for t in new_vocab)
    old = AutoModelForSequenceClassification.from_pretrained(tiny_classifier).eval()
    new = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True).eval()
    with torch.inference_mode():
        torch.testing.assert_close(new(**b).logits, old(**a).logits, atol=1e-5, rtol=0)


def test_unknown_words_become_unk_and_coverage_is_reported(tiny_classifier, tiny_data, trimmed, tmp_path):
    from transformers import AutoTokenizer

    out, _ = trimmed
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("the cinema was good")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "the", "[UNK]", "was", "good", "[SEP]"]

    # An eval split with words the training split lacks: their share is measured.
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text((tiny_data / "train.tsv").read_text())
    (data / "dev.tsv").write_text("sentence\tlabel\nthe cinema was good\t1\nthe film was bad\t0\n")
    result = run_stage(tiny_classifier, data, tmp_path / "out", "trim_vocab", {})
    assert result.eval_tokens == 8 and result.eval_tokens_dropped == pytest.approx(1 / 8)
    assert result.eval_unk_before == 0.0 and result.eval_unk_after == pytest.approx(1 / 8)
    assert result.eval_examples_changed == pytest.approx(0.5)
    # The hint names what would change something: the corpus already is the whole training
    # split, and the lost word became [UNK] in a WordPiece vocabulary.
    [hint] = [n for n in result.notes if "consider" in n]
    assert "train_full" not in hint and "keep_characters: true" in hint and "keep_top" in hint, hint

    # keep_top keeps the first entries of the original vocabulary, placeholders aside.
    from transformers import AutoTokenizer as Tok

    wider = run_stage(tiny_classifier, data, tmp_path / "wider", "trim_vocab", {"keep_top": 10})
    old_vocab = Tok.from_pretrained(tiny_classifier).get_vocab()
    first = sorted((i, t) for t, i in old_vocab.items() if not (t.startswith("[") and t.endswith("]")))[:10]
    assert {t for _, t in first} <= set(Tok.from_pretrained(tmp_path / "wider").get_vocab())
    assert wider.vocab_after > result.vocab_after


def test_resplit_spells_the_same_words_with_pieces_the_trimmed_vocabulary_keeps(tiny_classifier):
    from transformers import AutoTokenizer

    from compress.stages.trim_vocab import resplitter
    from compress.techniques.predict import Encoded

    tok = AutoTokenizer.from_pretrained(tiny_classifier)
    texts = ["the wonderful movie was terrible", "a fun day"]
    enc = tok(texts, ["story", "yes"])  # a pair: segment ids must follow the pieces
    feats = [{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")} | {"labels": 1, "idx": i}
             for i in range(2)]
    data = Encoded(feats, np.array([len(f["input_ids"]) for f in feats]))
    keep = set(tok.get_vocab().values()) - {tok.convert_tokens_to_ids("terrible")}
    stats = {}
    out = resplitter(tok, keep, 1.0, 0, 64, stats)(data)
    words = out.features[0]
    tokens = tok.convert_ids_to_tokens(words["input_ids"])
    assert tok.convert_tokens_to_string(tokens) == "[CLS] the wonderful movie was terrible [SEP] story [SEP]"
    # Every whole word of 4+ letters is split (prob 1): "wonderful" loses its own entry, and a
    # word whose entry is not kept splits as the trimmed tokenizer would split it anyway.
    assert "wonderful" not in tokens and "terrible" not in tokens and "movie" not in tokens
    assert {"the", "was"} <= set(tokens) and len(tokens) > len(feats[0]["input_ids"])
    assert words["token_type_ids"] == [0] * tokens.index("[SEP]") + [0] + [1] * (len(tokens) - tokens.index("[SEP]") - 1)
    assert len(words["attention_mask"]) == len(tokens) and out.lengths[0] == len(tokens)
    assert out.features[1]["input_ids"] == feats[1]["input_ids"]  # nothing long enough to split
    assert 0 < stats["tokens_split"] < 1 and out.features[0]["idx"] == 0
    assert resplitter(tok, keep, 0.0, 0, 64, {})(data).features == feats  # prob 0: unchanged
    assert resplitter(tok, keep, 1.0, 0, 8, {})(data).features[0] == feats[0]  # would outgrow max_length


def test_recovery_trains_on_resplit_text_before_cutting(tiny_classifier, tiny_data, tmp_path):
    from transformers import AutoModelForSequenceClassification

    result = run_stage(tiny_classifier, tiny_data, tmp_path / "out", "trim_vocab",
                       {"recovery": True, "split_prob": 0.5, "keep_characters": True, "lr": 1e-3, "batch_size": 16,
                        "max_length": 32})
    rec = result.recovery
    assert rec["train"]["examples"] == 200 and 0 < rec["tokens_split"] < 0.5
    assert rec["teacher_cache"]["examples"] == 200
    plain = run_stage(tiny_classifier, tiny_data, tmp_path / "plain", "trim_vocab", {"keep_characters": True})
    assert plain.recovery is None and plain.vocab_after == result.vocab_after
    a = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", use_safetensors=True).state_dict()
    b = AutoModelForSequenceClassification.from_pretrained(tmp_path / "plain", use_safetensors=True).state_dict()
    assert torch.equal(a["bert.embeddings.word_embeddings.weight"], b["bert.embeddings.word_embeddings.weight"])  # frozen
    assert not torch.equal(a["classifier.weight"], b["classifier.weight"])  # trained


@pytest.mark.parametrize("settings, key", [
    ({"corpus": "eval"}, "stages[1].with.corpus"),
    ({"min_count": 0}, "stages[1].with.min_count"),
    ({"keep_list": ["a"]}, "stages[1].with.keep_list"),
    ({"recovery": True, "split_prob": 1.5}, "stages[1].with.split_prob"),
    ({"recovery": True, "hidden_weight": 1.0}, "stages[1].with"),
])
def test_bad_settings_fail_validation_naming_the_key(tiny_checkpoint, tiny_data, settings, key):
    raw = tiny_recipe(tiny_checkpoint, tiny_data)
    raw["stages"][1] = {"id": "trimmed", "uses": "trim_vocab", "from": "baseline", "with": settings}
    with pytest.raises(RecipeError) as err:
        validate_recipe(raw)
    assert err.value.key == key


def test_chain_baseline_distill_prune_trim_runs_end_to_end(tiny_checkpoint, tiny_data, tmp_path):
    """baseline -> distill -> prune (with recovery) -> trim_vocab, through the runner."""
    raw = tiny_recipe(tiny_checkpoint, tiny_data)
    train = {"epochs": 1, "lr": 3.0e-3, "batch_size": 16, "max_length": 32}
    raw["stages"] = [
        raw["stages"][0],
        {"id": "student", "uses": "distill", "from": "baseline", "with": {**train, "layers": [1]}},
        {"id": "pruned", "uses": "prune", "from": "student",
         "with": {**train, "heads": 0.5, "ffn": 0.5, "importance_examples": 64}},
        {"id": "trimmed", "uses": "trim_vocab", "from": "pruned", "with": {}},
    ]
    raw["budget"]["max_accuracy_drop"] = 50.0
    raw["benchmark"].update(batch_sizes=[1], max_latency_examples=8, warmup=1)
    report = run_recipe(validate_recipe(raw), tmp_path, log=lambda m: None, threads=1)
    rows = {r["id"]: r for r in report["rows"]}
    assert set(rows) == {"baseline", "student", "pruned", "trimmed"}
    assert all(r["ok"] and r["accuracy"] is not None for r in rows.values()), [r.get("error") for r in rows.values()]
    stages = report["stages"]
    assert stages["student"]["result"]["student_layers"] == 1
    assert stages["pruned"]["result"]["recovery"]["teacher_cache"]["reused"] is False
    assert stages["trimmed"]["result"]["vocab_after"] < 1000
    run = tmp_path / "tiny"
    assert (run / "student" / "teacher_logits.npy").is_file() and (run / "pruned" / "teacher_logits.npy").is_file()
    assert len(list((run / ".cache").iterdir())) == 2  # one teacher per distilling stage
    sizes = {vid: rows[vid]["size_mb"] for vid in rows}
    assert sizes["trimmed"] < sizes["pruned"] < sizes["student"] < sizes["baseline"]
    assert np.load(run / "student" / "teacher_logits.npy").shape == (500, 2)
    assert json.loads((run / "pruned" / "config.json").read_text())["pruned_heads"]


# --- Byte-level BPE (RoBERTa) and Unigram (XLM-R, DeBERTa-v3, ALBERT) vocabularies ----------

UNSEEN = "the cinema with zebras was über naïve"  # words and characters the training split lacks


@pytest.fixture(scope="module")
def unseen_data(tiny_data, tmp_path_factory):
    d = tmp_path_factory.mktemp("unseen")
    (d / "train.tsv").write_text((tiny_data / "train.tsv").read_text())
    (d / "dev.tsv").write_text(f"sentence\tlabel\n{UNSEEN}\t1\nthe film was bad\t0\n", encoding="utf-8")
    return d


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "deberta-v2", "albert"])
def test_bpe_and_unigram_vocabularies_trim_without_changing_corpus_text(model_type, unseen_data, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.tiny_tokenizers import tiny_model

    src = tiny_model(tmp_path / "src", model_type)
    result = run_stage(src, unseen_data, tmp_path / "out", "trim_vocab", {})
    out = tmp_path / "out"
    old_tok, new_tok = AutoTokenizer.from_pretrained(src), AutoTokenizer.from_pretrained(out)
    assert result.tokenizer == ("BPE" if model_type == "roberta" else "Unigram")
    assert result.vocab_after == len(new_tok) < result.vocab_before
    # Training text splits into the same tokens, and the renumbered model gives the same logits.
    a = old_tok(IN_VOCAB, padding=True, return_tensors="pt")
    b = new_tok(IN_VOCAB, padding=True, return_tensors="pt")
    assert [old_tok.convert_ids_to_tokens(x) for x in a["input_ids"]] == \
        [new_tok.convert_ids_to_tokens(x) for x in b["input_ids"]]
    old = AutoModelForSequenceClassification.from_pretrained(src).eval()
    new = AutoModelForSequenceClassification.from_pretrained(out, use_safetensors=True).eval()
    with torch.inference_mode():
        torch.testing.assert_close(new(**b).logits, old(**a).logits, atol=1e-5, rtol=0)
    # Unseen words lose pieces but never become unknown: they split into smaller kept pieces.
    assert result.eval_tokens_dropped > 0 and result.eval_unk_after == result.eval_unk_before == 0.0
    assert new_tok.unk_token_id not in new_tok(UNSEEN)["input_ids"]
    assert new_tok.decode(new_tok(UNSEEN, add_special_tokens=False)["input_ids"]).strip() == UNSEEN
    assert "eval tokens" in result.notes[0] and "lost their entry" in result.notes[0]


def test_byte_level_bpe_keeps_every_byte_and_only_merges_it_can_still_make(unseen_data, tmp_path):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    from compress.stages.trim_vocab import _merged, _pair
    from tests.tiny_tokenizers import tiny_model

    src = tiny_model(tmp_path / "src", "roberta")
    run_stage(src, unseen_data, tmp_path / "out", "trim_vocab", {})
    before = json.loads(AutoTokenizer.from_pretrained(src).backend_tokenizer.to_str())["model"]
    after = json.loads(AutoTokenizer.from_pretrained(tmp_path / "out").backend_tokenizer.to_str())["model"]
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(after["vocab"])  # all 256 byte symbols
    kept = [tuple(_pair(m)) for m in after["merges"]]
    assert 0 < len(kept) < len(before["merges"])
    assert all(a in after["vocab"] and b in after["vocab"] and _merged(a, b, "") in after["vocab"] for a, b in kept)
    order = {tuple(_pair(m)): i for i, m in enumerate(before["merges"])}
    assert [order[m] for m in kept] == sorted(order[m] for m in kept)  # same ranks, same order


def _wordlevel_folder(tiny_classifier, tmp_path):
    """The tiny BERT classifier with a WordLevel tokenizer.json, a kind trim_vocab cannot trim."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path / "wordlevel"
    shutil.copytree(tiny_classifier, d)
    vocab = json.loads((tiny_classifier / "tokenizer.json").read_text())["model"]["vocab"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(d / "tokenizer.json"))
    return d


def test_a_tokenizer_kind_it_cannot_trim_is_refused_at_validation(tiny_classifier, tiny_data, tmp_path):
    from tests.tiny_tokenizers import tiny_model

    raw = tiny_recipe(_wordlevel_folder(tiny_classifier, tmp_path), tiny_data)
    raw["stages"] = [raw["stages"][0], {"id": "trimmed", "uses": "trim_vocab", "from": "baseline"}]
    with pytest.raises(RecipeError) as err:  # before any training: the baseline has not run
        validate_recipe(raw)
    assert err.value.key == "stages[1].uses" and "WordLevel" in str(err.value) and "\n" not in str(err.value)

    # Recovery re-splits words the WordPiece way: refused for BPE, naming the key.
    raw = tiny_recipe(tiny_model(tmp_path / "roberta", "roberta"), tiny_data)
    raw["stages"] = [raw["stages"][0], {"id": "trimmed", "uses": "trim_vocab", "from": "baseline",
                                        "with": {"recovery": True}}]
    with pytest.raises(RecipeError) as err:
        validate_recipe(raw)
    assert err.value.key == "stages[1].with.recovery" and "WordPiece" in str(err.value)
    raw["stages"][1]["with"] = {}
    validate_recipe(raw)  # BPE itself is fine


def test_the_coverage_hint_suggests_only_settings_that_would_change_something():
    from compress.stages.trim_vocab import Config, coverage_hint

    subset = coverage_hint(Config(corpus="train", min_count=3), "BPE", 1000, 200, unk_grew=False)
    assert "corpus: train_full (1000 training texts instead of 200)" in subset and "a min_count below 3" in subset
    assert "keep_characters" not in subset  # BPE keeps its bytes: nothing becomes unknown
    whole = coverage_hint(Config(corpus="train"), "WordPiece", 200, 200, unk_grew=True)
    assert "train_full" not in whole and "min_count" not in whole  # the subset is the whole split already
    assert "keep_characters: true" in whole
    wider = coverage_hint(Config(keep_top=500, keep_characters=True), "WordPiece", 200, 200, unk_grew=True)
    assert "a keep_top above 500" in wider and "keep_characters" not in wider
