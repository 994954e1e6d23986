"""`trim_vocab`: drop the vocabulary entries the task never uses, with their embedding rows.

For small encoders the word-embedding matrix is a large share of the model (MiniLM-L6:
11.7M of 22.7M parameters, 30522 x 384). The tokens kept are those that occur in the
training corpus (`corpus`: the whole training split or the training subset) at least
`min_count` times, every special and added token, and the `keep` list. Token ids are
renumbered in their old order; the tokenizer's vocabulary and the embedding rows are cut
to match, and both are saved so that `from_pretrained` loads them.

Eval words the corpus lacks reach the trimmed model split into smaller pieces, which a
model fine-tuned on whole words may read worse.
`recovery: true` trains against that before the rows are cut: a short distillation from
the untrimmed input in which some training words, each one vocabulary entry, are split
into the pieces the trimmed vocabulary would give them if it lacked them; the teacher sees
the text as it was, so the student learns to read a split word as the whole one.

Three kinds of fast tokenizer (tokenizer.json models) are trimmed, each keeping what its
algorithm needs so that every corpus word tokenizes exactly as before:
- WordPiece (BERT, MiniLM, DistilBERT, ELECTRA): the longest known piece matches first, so
  dropping unused entries changes no corpus word; an eval word whose pieces are gone becomes
  [UNK] unless `keep_characters` keeps the single characters.
- BPE (RoBERTa, GPT-2 style byte-level, and byte-fallback BPE): every base symbol (each of
  the 256 byte tokens, or whatever no merge produces) is kept, so no text becomes unknown; a
  kept token keeps the merges that build it, recursively, and a merge stays only when its
  two parts and its result are kept. BPE applies merges by rank, and the merges a corpus word
  goes through are all kept, in the same order, so it splits as before.
- Unigram (SentencePiece: XLM-R, DeBERTa-v3, ALBERT, T5): the best segmentation of a corpus
  word uses kept pieces only, and dropping other pieces only removes alternatives. Every
  single-character piece and byte-fallback piece is kept so that unseen words split into
  characters rather than <unk>, and so is the lowest-scored piece, because the library scores
  an unknown character relative to it.
The eval split is re-tokenized for the report: the share of its tokens that changed (lost
their entry, re-split) and of [UNK] before and after. Other models (WordLevel) are refused,
at validation when the recipe's model folder has its tokenizer.json. `recovery` re-splits
words the WordPiece way only, so it takes WordPiece tokenizers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from compress.core.registry import StageKind, StageResult
from compress.techniques.distillation import DistillSettings

if TYPE_CHECKING:  # pragma: no cover
    from typing import Callable

    from compress.techniques.predict import Encoded


class Config(DistillSettings):
    """Vocabulary trimming; the training fields (epochs, lr, ...) and distillation fields
    (temperature, alpha, ...) apply to the optional re-split recovery."""

    corpus: Literal["train_full", "train"] = Field(
        "train_full",
        description="Text whose tokens are kept: the whole training split (`train_full`) or only the "
        "training subset (`train`, data.max_train_examples). The eval split and the held-out sentences "
        "(data.holdout) are never used.",
    )
    min_count: PositiveInt = Field(1, description="Keep a token only if it occurs at least this often.")
    keep: list[str] = Field(
        default_factory=list,
        description="Tokens (vocabulary entries) or words always kept; a word keeps the pieces it tokenizes into.",
    )
    keep_characters: bool = Field(
        False,
        description="Also keep every single-character token (and its `##` form), so that unseen words "
        "split into characters instead of becoming [UNK] (about 2000 more rows for BERT vocabularies). "
        "WordPiece only: BPE and Unigram vocabularies always keep their bytes and characters.",
    )
    keep_top: NonNegativeInt = Field(
        0,
        description="Also keep the first N entries of the original vocabulary, bracketed placeholders "
        "such as [unused0] aside. BERT-style vocab.txt files list characters, then whole words roughly by "
        "frequency, so this keeps the commonest words that the corpus happens to lack: eval words then "
        "keep their own embedding instead of being split into other pieces. It helps less than one "
        "would hope: most of the loss comes from rare words beyond any top N.",
    )
    recovery: bool = Field(
        False,
        description="Before cutting, distil from the untrimmed input on training text in which words "
        "are randomly split the way the trimmed vocabulary splits words it lacks (see `split_prob`), so "
        "that eval words missing from the corpus cost less accuracy. Its effect is small and goes either "
        "way: turn it on where the benchmark shows trimming hurts.",
    )
    split_prob: float = Field(
        0.15, ge=0, le=1,
        description="With `recovery`: the chance that a training word of four or more letters that is one "
        "vocabulary entry is split into the pieces it would get without that entry (drawn once per example).",
    )
    lr: PositiveFloat = Field(5e-5, le=10, description="Peak learning rate of AdamW for the recovery (a light touch).")
    self_check_examples: PositiveInt = Field(
        2000, description="Training texts re-tokenized with the new tokenizer to verify ids map one to one."
    )

    @model_validator(mode="after")
    def _no_hidden_loss(self):
        if self.hidden_weight > 0:
            raise ValueError("hidden_weight: re-split text has more tokens than the teacher's, so hidden "
                             "states do not line up; use 0 (the default)")
        return self


class Result(StageResult):
    vocab_before: int
    vocab_after: int
    params_before: int
    params_after: int
    corpus: str
    tokenizer: str = "WordPiece"  # the tokenizer.json model kind: WordPiece, BPE or Unigram
    corpus_tokens: int
    eval_tokens: int
    eval_tokens_dropped: float  # share of eval tokens (old tokenizer) whose entry was dropped: re-split or [UNK]
    eval_examples_changed: float  # share of eval examples whose tokenization changed
    eval_unk_before: float  # share of [UNK] among eval tokens, old tokenizer
    eval_unk_after: float  # the same with the trimmed tokenizer: the rise is the share that became [UNK]
    recovery: dict | None = None  # training stats, teacher cache and share of words split, when recovery ran


def _remap_ids(node, new_id: dict[str, int]):
    """Rewrites token ids inside a tokenizer.json post-processor (TemplateProcessing's
    special_tokens {ids, tokens}; BertProcessing's ["[SEP]", 102] pairs; Sequence)."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "ids" and "tokens" in node:
                out[k] = [new_id[t] for t in node["tokens"]]
            elif k in ("sep", "cls") and isinstance(v, list) and len(v) == 2 and isinstance(v[0], str):
                out[k] = [v[0], new_id[v[0]]]
            else:
                out[k] = _remap_ids(v, new_id)
        return out
    if isinstance(node, list):
        return [_remap_ids(v, new_id) for v in node]
    return node


def trimmed_tokenizer(tok, keep_ids: list[int]):
    """A fast tokenizer of the same class whose vocabulary is `keep_ids` (old ids, sorted),
    renumbered 0..len-1 in that order."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(tok.backend_tokenizer.to_str())
    model = spec["model"]
    if model["type"] == "Unigram":  # [[piece, score], ...]: the id is the position
        by_id = {i: piece for i, (piece, _) in enumerate(model["vocab"])}
    else:
        by_id = {i: t for t, i in model["vocab"].items()}  # token -> old id
    for added in spec.get("added_tokens", []):
        by_id.setdefault(added["id"], added["content"])
    new_id = {by_id[i]: n for n, i in enumerate(keep_ids)}
    if model["type"] == "Unigram":
        # Added tokens past the model's pieces (DeBERTa-v3's [MASK] is 128000) stay added tokens;
        # they sort last, so the pieces keep ids 0..n-1.
        model["vocab"] = [model["vocab"][i] for i in keep_ids if i < len(model["vocab"])]
        if model.get("unk_id") is not None:
            model["unk_id"] = new_id[by_id[model["unk_id"]]]
    else:
        model["vocab"] = new_id
    if model["type"] == "BPE":  # a merge stays when its parts and its result do (see bpe_keep)
        prefix = model.get("continuing_subword_prefix") or ""
        model["merges"] = [m for m in model["merges"]
                           if all(t in new_id for t in (*_pair(m), _merged(*_pair(m), prefix)))]
    for added in spec.get("added_tokens", []):
        added["id"] = new_id[added["content"]]
    if spec.get("post_processor"):
        spec["post_processor"] = _remap_ids(spec["post_processor"], new_id)
    if spec.get("padding") and spec["padding"].get("pad_token") in new_id:
        spec["padding"]["pad_id"] = new_id[spec["padding"]["pad_token"]]
    # The ids of added tokens are read from the backend; the old table would contradict it.
    kwargs = {k: v for k, v in tok.init_kwargs.items()
              if k not in ("added_tokens_decoder", "vocab_file", "tokenizer_file", "name_or_path", "tokenizer_object")}
    return type(tok)(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), **kwargs)


def _pair(merge) -> tuple[str, str]:
    """A tokenizer.json merge: "a b" (older files) or ["a", "b"]."""
    if isinstance(merge, str):
        a, b = merge.split(" ", 1)
        return a, b
    return merge[0], merge[1]


def _merged(a: str, b: str, prefix: str) -> str:
    """The token a BPE merge makes: with a continuing-subword prefix (`##`), the right
    part's prefix goes (a + ##b -> ab, ##a + ##b -> ##ab)."""
    return a + (b[len(prefix):] if prefix and b.startswith(prefix) else b)


def bpe_keep(model: dict, keep: set[int]) -> set[int]:
    """`keep` (ids) plus what BPE needs: every base symbol (a token that no merge produces:
    the 256 byte tokens of byte-level BPE, <0x..> byte-fallback tokens, single characters),
    so that no text becomes unknown, and every part of the merges that build a kept token,
    recursively, so that the kept tokens can still be reached."""
    vocab: dict[str, int] = model["vocab"]
    prefix = model.get("continuing_subword_prefix") or ""
    made: dict[str, list[tuple[str, str]]] = {}
    for m in model["merges"]:
        a, b = _pair(m)
        made.setdefault(_merged(a, b, prefix), []).append((a, b))
    out = set(keep) | {i for t, i in vocab.items() if t not in made}
    token_of = {i: t for t, i in vocab.items()}
    todo = [token_of[i] for i in out if i in token_of]
    while todo:
        for a, b in made.get(todo.pop(), ()):
            for part in (a, b):
                if part in vocab and vocab[part] not in out:
                    out.add(vocab[part])
                    todo.append(part)
    return out


def unigram_keep(model: dict, keep: set[int]) -> set[int]:
    """`keep` (ids) plus every single-character piece and byte-fallback piece (<0x41>), so
    that an unseen word splits into characters or bytes instead of becoming <unk>, and the
    lowest-scored piece: the library scores an unknown character from the lowest score in
    the vocabulary, and a different score could change how corpus text splits."""
    pieces = model["vocab"]
    out = set(keep) | {i for i, (p, _) in enumerate(pieces) if len(p) == 1}
    if model.get("byte_fallback"):
        out |= {i for i, (p, _) in enumerate(pieces) if len(p) == 6 and p.startswith("<0x") and p.endswith(">")}
    if pieces:
        out.add(min(range(len(pieces)), key=lambda i: pieces[i][1]))
    return out


TRIMMABLE = ("WordPiece", "BPE", "Unigram")


def check_tokenizer(cfg: "Config", tokenizer_json: dict) -> str | None:
    """Validation-time check against the input's tokenizer.json."""
    kind = tokenizer_json.get("model", {}).get("type")
    if kind not in TRIMMABLE:
        return (f"trim_vocab trims {', '.join(TRIMMABLE)} tokenizers, not this model's ({kind}); "
                f"remove the stage for this model")
    if cfg.recovery and kind != "WordPiece":
        return (f"recovery: re-splitting words for recovery needs a WordPiece tokenizer (this one: {kind}); "
                f"set recovery: false")
    return None


def resplitter(tok, keep_ids: set[int], prob: float, seed: int, max_length: int, stats: dict) -> "Callable[[Encoded], Encoded]":
    """perturb(Encoded) -> Encoded: each token that is a whole word of four or more letters
    is, with probability `prob`, replaced by the pieces WordPiece gives that word from the
    kept vocabulary without the word's own entry. Segment ids follow the token they replace;
    an example that would outgrow `max_length` stays as it was. `stats` receives the share
    of tokens split.

    WordPiece is written out here (greedy longest match, continuation pieces prefixed) because
    the tokenizers library cannot tokenize as if one entry were absent."""
    import json

    import numpy as np

    from compress.techniques.predict import Encoded

    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    prefix = model.get("continuing_subword_prefix") or "##"
    vocab = tok.get_vocab()
    token_of = {i: t for t, i in vocab.items()}
    kept = {token_of[i] for i in keep_ids if i in token_of}
    special = set(tok.all_special_ids)

    def pieces(word: str) -> list[int] | None:
        out, start = [], 0
        while start < len(word):
            end, found = len(word), None
            while start < end:
                sub = word[start:end] if start == 0 else prefix + word[start:end]
                if sub in kept and sub != word:
                    found = sub
                    break
                end -= 1
            if found is None:  # the word would become [UNK]: no reading to learn
                return None
            out.append(vocab[found])
            start = end
        return out

    split_of: dict[int, list[int] | None] = {}

    def candidate(i: int) -> list[int] | None:
        if i not in split_of:
            t = token_of.get(i, "")
            split_of[i] = pieces(t) if i not in special and t.isalpha() and len(t) >= 4 else None
        return split_of[i]

    def perturb(data: "Encoded") -> "Encoded":
        rng = np.random.default_rng(seed)
        features, total, split = [], 0, 0
        for f in data.features:
            ids, types = f["input_ids"], f.get("token_type_ids")
            new_ids, new_types, n_split = [], [], 0
            draws = rng.random(len(ids))
            for pos, i in enumerate(ids):
                rep = candidate(i) if draws[pos] < prob else None
                new_ids.extend(rep or [i])
                if types is not None:
                    new_types.extend([types[pos]] * len(rep or [i]))
                n_split += rep is not None
            total += len(ids)
            if len(new_ids) > max_length:
                new_ids, new_types, n_split = list(ids), list(types or []), 0
            split += n_split
            g = {**f, "input_ids": new_ids, "attention_mask": [1] * len(new_ids)}
            if types is not None:
                g["token_type_ids"] = new_types
            features.append(g)
        stats["tokens_split"] = round(split / max(total, 1), 6)
        return Encoded(features, np.array([len(g["input_ids"]) for g in features]))

    return perturb


def _token_lists(tok, split, **kw) -> list[list[int]]:
    return tok(split.texts, split.pairs, add_special_tokens=False, **kw)["input_ids"]


def run(ctx) -> Result:
    import json
    import tempfile
    from collections import Counter

    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from compress.core.errors import StageError
    from compress.formats import hf
    from compress.recipe.peek import PADDING_OFFSET_TYPES

    cfg: Config = ctx.config
    torch.set_num_threads(ctx.threads)
    tok = AutoTokenizer.from_pretrained(ctx.input.path, trust_remote_code=ctx.recipe.model.trust_remote_code)
    if not tok.is_fast:
        raise StageError(f"{ctx.stage_id}: trim_vocab needs a fast tokenizer (tokenizer.json); this model has "
                         f"only a slow one: remove the stage for this model")
    tok_spec = json.loads(tok.backend_tokenizer.to_str())
    model_type = tok_spec["model"]["type"]
    problem = check_tokenizer(cfg, tok_spec)
    if problem:
        raise StageError(f"{ctx.stage_id}: {problem}")
    model = hf.load_model(ctx.input.path, ctx.recipe.model.trust_remote_code).eval()
    if model.get_output_embeddings() is not None:
        raise StageError(f"{ctx.stage_id}: the model ties its embeddings to an output layer; trim_vocab cannot cut it")
    params_before = sum(p.numel() for p in model.parameters())
    vocab_before = len(tok)

    # Never the held-out sentences (data.holdout): their words must reach the model as new
    # eval words do, or a held-out check would not see what trimming costs.
    split = ctx.data.train_unheld if cfg.corpus == "train_full" else ctx.data.train
    counts: Counter = Counter()
    for ids in _token_lists(tok, split):
        counts.update(ids)
    keep = {i for i, c in counts.items() if c >= cfg.min_count}
    keep |= set(tok.all_special_ids) | set(tok.added_tokens_decoder)
    vocab = tok.get_vocab()
    for item in cfg.keep:
        keep |= {vocab[item]} if item in vocab else set(tok(item, add_special_tokens=False)["input_ids"])
    if cfg.keep_top:
        ordered = sorted((i, t) for t, i in vocab.items() if not (t.startswith("[") and t.endswith("]")))
        keep |= {i for i, _ in ordered[: cfg.keep_top]}
    if cfg.keep_characters:
        keep |= {i for t, i in vocab.items() if len(t) == 1 or (t.startswith("##") and len(t) == 3)}
    if model_type == "BPE":
        keep = bpe_keep(tok_spec["model"], keep)
    elif model_type == "Unigram":
        keep = unigram_keep(tok_spec["model"], keep)
    keep_ids = sorted(keep)
    remap = np.full(max(vocab.values()) + 1, -1, dtype=np.int64)  # old id -> new id (-1: dropped)
    remap[keep_ids] = np.arange(len(keep_ids))

    recovery = None
    if cfg.recovery:
        import copy

        from compress.techniques.distillation import distill_from

        teacher = model.to(ctx.device)  # train() seeds the student's training itself
        split_stats: dict = {}
        perturb = resplitter(tok, set(keep_ids), cfg.split_prob, cfg.seed, cfg.max_length, split_stats)
        student, stats, cache, _ = distill_from(ctx, copy.deepcopy(teacher), teacher, tok, cfg, [],
                                                f"{ctx.stage_id}: recovery", student_inputs=perturb)
        model = student.eval().cpu()
        del teacher
        ctx.log(f"  recovery: {stats.examples} examples, {split_stats['tokens_split']:.1%} of tokens split, "
                f"{stats.seconds:.0f}s ({stats.examples_per_s:.0f} ex/s)")
        recovery = {"train": stats.as_dict(), "teacher_cache": cache, **split_stats}

    new_tok = trimmed_tokenizer(tok, keep_ids)
    with tempfile.TemporaryDirectory() as tmp:  # check what will be loaded, not the object in memory
        new_tok.save_pretrained(tmp)
        new_tok = AutoTokenizer.from_pretrained(tmp, trust_remote_code=ctx.recipe.model.trust_remote_code)
    sample = split.select(range(min(cfg.self_check_examples, len(split))))
    for old_ids, new_ids in zip(_token_lists(tok, sample), _token_lists(new_tok, sample)):
        if remap[old_ids].tolist() != new_ids:  # corpus words must tokenize exactly as before
            raise StageError(f"{ctx.stage_id}: the trimmed tokenizer splits corpus text differently; this is a bug")

    # Embedding rows follow the tokens: new row n is old row keep_ids[n].  [V_new, H]
    old_emb = model.get_input_embeddings()
    pad = old_emb.padding_idx
    new_emb = torch.nn.Embedding(len(keep_ids), old_emb.embedding_dim,
                                 padding_idx=int(remap[pad]) if pad is not None else None)
    with torch.no_grad():
        new_emb.weight.copy_(old_emb.weight[torch.tensor(keep_ids)])
    if pad is not None and int(remap[pad]) != pad and model.config.model_type in PADDING_OFFSET_TYPES:
        # These models number positions from the pad id: a new pad id would shift them all.
        raise StageError(f"{ctx.stage_id}: the padding token would move from id {pad} to {int(remap[pad])}, which "
                         f"{model.config.model_type} numbers positions from; keep every token below it (keep_top: {pad + 1})")
    model.set_input_embeddings(new_emb)
    model.config.vocab_size = len(keep_ids)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id"):
        old = getattr(model.config, key, None)
        if isinstance(old, int) and 0 <= old < len(remap):
            setattr(model.config, key, int(remap[old]) if remap[old] >= 0 else None)
    hf.save(model, new_tok, ctx.out)

    # Coverage on the eval split (measured, never used for choosing tokens).
    old_eval = _token_lists(tok, ctx.data.eval)
    new_eval = _token_lists(new_tok, ctx.data.eval)
    flat_old = np.concatenate([np.asarray(x, dtype=np.int64) for x in old_eval]) if old_eval else np.zeros(0, np.int64)
    n_old = max(len(flat_old), 1)
    n_new = max(sum(len(x) for x in new_eval), 1)
    dropped = float((remap[flat_old] < 0).sum() / n_old)
    changed = float(np.mean([remap[o].tolist() != n for o, n in zip(old_eval, new_eval)])) if old_eval else 0.0
    unk_before = float((flat_old == tok.unk_token_id).sum() / n_old) if tok.unk_token_id is not None else 0.0
    unk_after = float(sum(x.count(new_tok.unk_token_id) for x in new_eval) / n_new) if new_tok.unk_token_id is not None else 0.0
    params_after = sum(p.numel() for p in model.parameters())
    ctx.log(
        f"  vocabulary {vocab_before} -> {len(new_tok)}, parameters {params_before / 1e6:.1f}M -> "
        f"{params_after / 1e6:.1f}M; eval tokens dropped {dropped:.2%} (re-split or [UNK]), [UNK] "
        f"{unk_before:.2%} -> {unk_after:.2%}"
    )
    changed_tokens = int((remap[flat_old] < 0).sum())
    notes = [f"{model_type} vocabulary: {changed_tokens} of {len(flat_old)} eval tokens ({dropped:.2%}) lost their "
             f"entry and were re-split{' or became ' + str(tok.unk_token) if unk_after > unk_before else ''}; "
             f"{changed:.1%} of eval examples tokenize differently"]
    if dropped > 0.01:
        hint = coverage_hint(cfg, model_type, len(ctx.data.train_unheld), len(split), unk_after > unk_before)
        notes.append(f"{dropped:.1%} of eval tokens lost their vocabulary entry (re-split or [UNK]); consider {hint}")
    return Result(
        format="hf",
        vocab_before=vocab_before,
        vocab_after=len(new_tok),
        params_before=params_before,
        params_after=params_after,
        corpus=cfg.corpus,
        tokenizer=model_type,
        corpus_tokens=int(sum(counts.values())),
        eval_tokens=int(len(flat_old)),
        eval_tokens_dropped=round(dropped, 6),
        eval_examples_changed=round(changed, 6),
        eval_unk_before=round(unk_before, 6),
        eval_unk_after=round(unk_after, 6),
        recovery=recovery,
        notes=notes,
    )


def coverage_hint(cfg: Config, model_type: str, full_texts: int, corpus_texts: int, unk_grew: bool) -> str:
    """What would keep more eval tokens, among the settings that would change something here:
    the whole training split only when the corpus is a smaller subset of it, characters
    only for WordPiece with new [UNK]s, a lower min_count only above 1."""
    options = []
    if cfg.corpus != "train_full" and full_texts > corpus_texts:
        options.append(f"corpus: train_full ({full_texts} training texts instead of {corpus_texts})")
    if cfg.min_count > 1:
        options.append(f"a min_count below {cfg.min_count}")
    if model_type == "WordPiece" and unk_grew and not cfg.keep_characters:
        options.append("keep_characters: true (unseen words split into characters instead of [UNK])")
    options.append(f"a keep_top above {cfg.keep_top}" if cfg.keep_top else "keep_top (the commonest entries of the vocabulary)")
    options.append("`keep` for the words of your domain")
    return ", ".join(options[:-1]) + " or " + options[-1]


KIND = StageKind(
    name="trim_vocab",
    summary="Keep only the vocabulary the training corpus uses (WordPiece, BPE, Unigram), cutting the embedding matrix.",
    config=Config,
    result=Result,
    run=run,
    accepts=("hf",),
    produces="hf",
    new_tokenizer=True,
    keeps_architecture=lambda cfg: True,
    check_tokenizer=check_tokenizer,
)
