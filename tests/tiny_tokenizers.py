"""Tiny tokenizers of the kinds trim_vocab takes besides WordPiece, trained offline with the
`tokenizers` library, and tiny random classifiers of the architectures that use them."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import NEG, NOUNS, POS, synthetic_rows

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
EXTRA = ["a cinema with zebras and a café", "über naïve façade", "hello world, it's fine!",
         "the screenplay was unremarkable", "performances were outstanding throughout"]


def corpus() -> list[str]:
    return [t for t, _ in synthetic_rows(400, 7)] + EXTRA * 3 + [" ".join(POS + NEG + NOUNS)]


def _fast(cls, backend):
    return cls(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
               unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


def byte_level_bpe(vocab_size: int = 420):
    """RoBERTa / GPT-2 style: byte-level pre-tokenizer, the 256 byte symbols, merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import RobertaTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return _fast(RobertaTokenizerFast, tok)


def unigram(cls_name: str = "XLMRobertaTokenizerFast", vocab_size: int = 200, mask_after: bool = False):
    """SentencePiece style: Metaspace (▁) pre-tokenizer and a Unigram model. `mask_after`: the
    mask token is added after the pieces, past the model's vocabulary (as DeBERTa-v3's [MASK])."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(corpus(), trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS[:-1] if mask_after else SPECIALS, unk_token="<unk>"))
    if mask_after:
        tok.add_special_tokens(["<mask>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return _fast(getattr(transformers, cls_name), tok)


ARCHS = {
    # model_type: (config class, model class, tokenizer builder)
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification", byte_level_bpe),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification", unigram),
    "deberta-v2": ("DebertaV2Config", "DebertaV2ForSequenceClassification",
                   lambda: unigram("DebertaV2TokenizerFast", mask_after=True)),
    "albert": ("AlbertConfig", "AlbertForSequenceClassification", lambda: unigram("AlbertTokenizerFast")),
}


def tiny_model(folder: Path, model_type: str, max_position_embeddings: int = 130, **config) -> Path:
    """A random tiny classifier of `model_type` with its tokenizer, saved in `folder`."""
    import torch
    import transformers

    config_cls, model_cls, make_tokenizer = ARCHS[model_type]
    tok = make_tokenizer()
    torch.manual_seed(0)
    cfg = getattr(transformers, config_cls)(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=max_position_embeddings, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        **({"embedding_size": 16} if model_type == "albert" else {}), **config)
    getattr(transformers, model_cls)(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def causal_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer as causal LMs use (GPT-2, SmolLM2): eos <|im_end|>, bos
    <|endoftext|> (not prepended), no pad token, a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", chat_template=CHATML)


def tiny_causal(folder: Path, family: str = "llama", tie: bool = True) -> Path:
    """A random tiny causal LM (`llama` or `qwen2`) with causal_tokenizer, saved in `folder`.
    Qwen2 rather than GPT-2 as the second family: GPT-2's projections are Conv1D modules,
    which no Linear quantizer touches; Qwen2 adds q/k/v biases to Llama's layout."""
    import torch
    import transformers

    tok = causal_tokenizer()
    torch.manual_seed(0)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    vocab = -(-len(tok) // 16) * 16  # padded as real vocabularies are (torch's CPU INT4 packing needs it)
    if family == "llama":
        cfg = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tie, **ids)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tie, **ids)
        model = transformers.Qwen2ForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
