"""Augmented copies of whole training sentences for distillation: the teacher labels them,
so a small student learns what the teacher does with sentence-length inputs, not only with
the short phrases that make up most of a treebank's training split.

The recipe is Tang et al. (2019, "Distilling task-specific knowledge from BERT into simple
neural networks"): each word of a copy is, independently, replaced by the mask token (with
probability `mask`), by a word drawn from the training sentences' own words, in proportion
to their counts (`swap`), or kept; a share of the copies (`span`) is then cut to a random
contiguous span of at least half its words. TinyBERT (Jiao et al. 2020) draws replacements
from a masked language model and GloVe neighbours instead; neither ships with an encoder
fine-tuned for a task, and words of the training text itself need nothing more.

Written here because no maintained library does word-level augmentation for a teacher to
label without pulling in models or corpora of its own (nlpaug's context augmenters load
a language model; its random word augmenter draws no in-corpus words).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, model_validator

if TYPE_CHECKING:  # pragma: no cover
    from compress.tasks.classification.data import Split


class AugmentSpec(BaseModel):
    """Augmented copies of whole training sentences, labelled by the teacher."""

    model_config = ConfigDict(extra="forbid")

    copies: NonNegativeInt = Field(
        0, le=100,
        description="Augmented copies of each whole sentence of the training examples (a row that is "
        "not a span of a longer row; with text pairs, every row). 0: none.",
    )
    mask: float = Field(0.1, ge=0, le=1, description="Chance that a word of a copy becomes the mask token.")
    swap: float = Field(0.1, ge=0, le=1, description="Chance that a word of a copy becomes another word of the training sentences.")
    span: float = Field(0.3, ge=0, le=1, description="Share of copies cut to a random span of at least half their words.")
    seed: int = Field(0, description="Seed of the copies.")

    @model_validator(mode="after")
    def _shares(self):
        if self.mask + self.swap > 1:
            raise ValueError("mask + swap must be at most 1")
        return self


def _copy(words: list[str], spec: AugmentSpec, mask_token: str | None, vocabulary: list[str],
          rng: random.Random) -> str:
    mask = spec.mask if mask_token is not None else 0.0  # no mask token (byte-level BPE): swaps only
    out = []
    for w in words:
        u = rng.random()
        if u < mask:
            out.append(mask_token)
        elif u < mask + spec.swap:
            out.append(rng.choice(vocabulary))  # a draw from the word list: frequent words more often
        else:
            out.append(w)
    if len(out) > 3 and rng.random() < spec.span:
        n = rng.randint(max(2, len(out) // 2), len(out) - 1)
        start = rng.randint(0, len(out) - n)
        out = out[start : start + n]
    return " ".join(out)


def augment(split: "Split", spec: AugmentSpec, mask_token: str | None,
            sentences: "frozenset[str] | None" = None) -> "Split":
    """`spec.copies` augmented copies of each whole sentence of `split`, each with its
    sentence's label (for the cross-entropy term; the teacher's logits say how far the copy
    moved). `sentences`: the whole sentences of the split it was drawn from (Data.sentences),
    words joined by single spaces; None: rows of `split` that no other row of it contains
    (a random subset of a treebank holds phrases whose sentence it left out: pass them).
    Text pairs: every row, both texts augmented. Deterministic for a split and a spec."""
    from compress.tasks.classification.data import Split, whole_rows

    if spec.copies == 0 or len(split) == 0:
        return Split([], [] if split.pairs is not None else None, split.labels[:0])
    if split.pairs is not None:
        rows = np.arange(len(split))
    elif sentences is not None:
        rows = np.array([i for i, t in enumerate(split.texts) if " ".join(t.split()) in sentences], dtype=np.int64)
    else:
        rows = whole_rows(split.texts)
    rng = random.Random(spec.seed)
    vocabulary = [w for i in rows for w in split.texts[i].split()]
    if split.pairs is not None:
        vocabulary += [w for i in rows for w in split.pairs[i].split()]
    texts, pairs, source = [], [] if split.pairs is not None else None, []
    for i in rows:
        words = split.texts[i].split()
        for _ in range(spec.copies):
            texts.append(_copy(words, spec, mask_token, vocabulary, rng))
            if pairs is not None:
                pairs.append(_copy(split.pairs[i].split(), spec, mask_token, vocabulary, rng))
            source.append(i)
    return Split(texts, pairs, split.labels[np.array(source, dtype=np.int64)])
