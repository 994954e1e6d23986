"""compress.techniques.predict: the model-input keys, tokenised examples and batched prediction that
stages and formats share."""

import numpy as np
import pytest

from compress.tasks.classification.data import Split
from compress.formats import MODEL_INPUTS, model_inputs
from compress.techniques.predict import (encode, gather_logits, length_sorted_batches,
                              padded_batches, predictor_logits)

TEXTS = ["a much longer sentence than the others here", "short", "a middling sentence", "tiny one", "x"]


def split() -> Split:
    return Split(list(TEXTS), None, np.array([0, 1, 0, 1, 0]))


def test_model_inputs_keeps_only_what_a_model_takes():
    batch = {"input_ids": 1, "labels": 2, "attention_mask": 3, "idx": 4, "text": 5, "token_type_ids": 6}
    assert model_inputs(batch) == {"input_ids": 1, "attention_mask": 3, "token_type_ids": 6}
    # An ONNX graph without segments: only the inputs it declares.
    assert model_inputs(batch, ("input_ids", "attention_mask")) == {"input_ids": 1, "attention_mask": 3}
    assert set(MODEL_INPUTS) == {"input_ids", "attention_mask", "token_type_ids"}


def test_gather_logits_puts_every_row_back_in_example_order():
    lengths = np.array([7, 1, 4, 2, 1])
    batches = length_sorted_batches(lengths, 2)
    assert batches == [[1, 4], [3, 2], [0]]  # shortest first, ties in example order
    seen = []
    # Each row's logit is its example number: the gathered array must read 0..4 down.
    out = gather_logits(5, ((idx, idx) for idx in batches), lambda idx: np.array([[i, -i] for i in idx], float),
                        on_batch=seen.append)
    assert out.dtype == np.float32 and out[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert seen == [2, 2, 1]
    with pytest.raises(ValueError, match="no examples"):
        gather_logits(0, [], lambda b: b)


def test_predictor_logits_tokenizes_with_the_predictors_own_tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    calls = []

    class Fake:
        tokenizer = tok
        input_names = ("input_ids", "attention_mask")  # no token_type_ids, as a DistilBERT graph

        def __call__(self, batch):
            calls.append(sorted(batch))
            assert all(v.dtype == np.int64 for v in batch.values())
            # logit 0: the example's real token count, recognisable after the reordering
            return np.stack([batch["attention_mask"].sum(1), np.zeros(len(batch["input_ids"]))], 1)

    out = predictor_logits(Fake(), split(), max_length=16, batch_size=2)
    expected = [len(tok(t, truncation=True, max_length=16)["input_ids"]) for t in TEXTS]
    assert out[:, 0].tolist() == expected
    assert calls and all(c == ["attention_mask", "input_ids"] for c in calls)


def test_encoded_examples_batch_with_or_without_labels(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    data = encode(tok, split(), 16)
    assert [f["idx"] for f in data.features] == [0, 1, 2, 3, 4]
    assert set(data.features[0]) == {"input_ids", "attention_mask", "token_type_ids", "labels", "idx"}
    plain = list(padded_batches(data, tok, 2))
    labelled = list(padded_batches(data, tok, 2, labels=True))
    assert [idx for idx, _ in plain] == length_sorted_batches(data.lengths, 2)
    assert all(set(b) == {"input_ids", "attention_mask", "token_type_ids"} for _, b in plain)
    for idx, b in labelled:
        assert b["labels"].tolist() == [int(split().labels[i]) for i in idx]
        assert b["input_ids"].shape[1] == max(data.lengths[idx])  # padded to the batch's longest only
