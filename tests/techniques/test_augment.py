import numpy as np
import pytest
from pydantic import ValidationError

from compress.techniques.augment import AugmentSpec, augment
from compress.tasks.classification.data import Split, whole_rows

ROWS = ["a fine film about loss", "a fine film", "film about loss", "dull and long", "dull"]


def _split(texts, pairs=None):
    return Split(list(texts), pairs, np.arange(len(texts), dtype=np.int64))


def test_whole_rows_are_the_rows_no_other_row_contains():
    assert whole_rows(ROWS).tolist() == [0, 3]
    # Word boundaries count, not characters: "dul" is not a span of "dull and long".
    assert whole_rows(["dull and long", "dul"]).tolist() == [0, 1]


def test_copies_come_from_whole_sentences_only_with_their_labels():
    out = augment(_split(ROWS), AugmentSpec(copies=3, mask=0.3, swap=0.3), "[MASK]")
    assert len(out) == 6 and out.labels.tolist() == [0, 0, 0, 3, 3, 3]
    assert out.pairs is None
    assert any(t != ROWS[0] for t in out.texts[:3])  # p(unchanged copy of 5 words) is small: the ops run
    words = {w for t in ROWS for w in t.split()} | {"[MASK]"}
    assert all(set(t.split()) <= words for t in out.texts)  # swaps draw words of the sentences only


def test_given_sentences_pick_the_rows_to_copy():
    # A random subset of a treebank holds phrases whose sentence it left out: only real sentences count.
    out = augment(_split(["a fine film", "dull"]), AugmentSpec(copies=2), "[MASK]", frozenset({"dull"}))
    assert out.labels.tolist() == [1, 1]


def test_no_copies_and_determinism():
    assert len(augment(_split(ROWS), AugmentSpec(copies=0), "[MASK]")) == 0
    spec = AugmentSpec(copies=4, seed=3)
    assert augment(_split(ROWS), spec, "[MASK]").texts == augment(_split(ROWS), spec, "[MASK]").texts
    assert augment(_split(ROWS), spec, "[MASK]").texts != augment(_split(ROWS), AugmentSpec(copies=4, seed=4), "[MASK]").texts


def test_mask_everything_and_no_mask_token():
    out = augment(_split(["one two three four five six"]), AugmentSpec(copies=2, mask=1.0, swap=0.0, span=0.0), "<mask>")
    assert out.texts == ["<mask> " * 5 + "<mask>"] * 2
    # A tokenizer without a mask token (byte-level BPE): masking is off, the words stay.
    out = augment(_split(["one two three"]), AugmentSpec(copies=1, mask=1.0, swap=0.0, span=0.0), None)
    assert out.texts == ["one two three"]


def test_spans_keep_at_least_half_the_words_in_order():
    text = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9"
    out = augment(_split([text]), AugmentSpec(copies=50, mask=0.0, swap=0.0, span=1.0), "[MASK]")
    for t in out.texts:
        assert 5 <= len(t.split()) <= 9 and t in text


def test_pairs_augment_both_texts_of_every_row():
    out = augment(_split(["a b c d", "e f"], pairs=["g h i j", "k l"]), AugmentSpec(copies=2, mask=1.0, swap=0.0, span=0.0), "[M]")
    assert len(out) == 4 and out.pairs == ["[M] [M] [M] [M]"] * 2 + ["[M] [M]"] * 2


@pytest.mark.parametrize("bad", [{"mask": 0.7, "swap": 0.6}, {"copies": -1}, {"mask": 1.5}, {"nope": 1}])
def test_bad_specs_fail(bad):
    with pytest.raises(ValidationError):
        AugmentSpec(**bad)
