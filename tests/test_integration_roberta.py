"""A non-BERT family on real data: a small RoBERTa (byte-level BPE tokenizer trained here on
the SST-2 training sentences, model built from a config) through the small chain
finetune -> distill -> prune -> export_onnx -> quantize_onnx, benchmarked and decided
(about 2 minutes on a shared 2-core CPU).

Needs only SST-2 at ../shared/data/sst2 (no download). A pretrained RoBERTa or MPNet would
be 400+ MB: a model trained from scratch here exercises the same code paths in seconds."""

import json

import pytest

from tests.conftest import SST2

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (SST2 / "train.tsv").is_file(), reason="SST-2 not found at ../shared/data/sst2"),
]


@pytest.fixture(scope="module")
def small_roberta(tmp_path_factory):
    import csv

    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    folder = tmp_path_factory.mktemp("roberta")
    with open(SST2 / "train.tsv", encoding="utf-8") as fh:
        sentences = [row["sentence"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(sentences[:20000], vocab_size=2000,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(folder))
    tok = RobertaTokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"))
    tok.save_pretrained(folder)
    config = RobertaConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=256, max_position_embeddings=130, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(folder)
    return folder


def test_roberta_small_chain_on_sst2(small_roberta, cli, tmp_path, write_recipe, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = {
        "schema_version": 1,
        "name": "roberta_chain",
        "model": {"source": str(small_roberta)},
        "data": {"dataset": str(SST2), "eval_split": "dev", "max_train_examples": 3000, "max_eval_examples": 300},
        "stages": [
            {"id": "baseline", "uses": "finetune",
             "with": {"epochs": 2, "lr": 1e-3, "batch_size": 32, "max_length": 64, "warmup_ratio": 0.1}},
            {"id": "student", "uses": "distill", "from": "baseline",
             "with": {"epochs": 1, "batch_size": 32, "max_length": 64}},
            {"id": "pruned", "uses": "prune", "from": "student",
             "with": {"heads": 0.25, "ffn": 0.5, "importance_examples": 128, "epochs": 1, "batch_size": 32,
                      "max_length": 64}},
            {"id": "onnx", "uses": "export_onnx", "from": "pruned", "with": {"parity_examples": 64, "max_length": 64}},
            {"id": "onnx_int8", "uses": "quantize_onnx", "from": "onnx",
             "with": {"calibration_examples": 64, "parity_examples": 64, "max_length": 64}},
        ],
        "benchmark": {"devices": ["cpu"], "threads": 1, "batch_sizes": [1, 8], "warmup": 2,
                      "max_latency_examples": 30, "latency_rounds": 1, "bootstrap_samples": 200},
        "budget": {"max_accuracy_drop": 10.0},
    }
    art = tmp_path / "artifacts"
    code, out, err = cli("run", write_recipe(recipe), "--artifacts", art)
    assert code in (0, 3), err
    report = json.loads((art / "roberta_chain" / "report.json").read_text())
    rows = {r["id"]: r for r in report["rows"]}
    assert all(rows[v]["ok"] for v in ("baseline", "student", "pruned", "onnx", "onnx_int8")), rows
    # Trained from scratch on 3000 sentences the model stays near chance (53-55% in two runs):
    # this test is about the chain working on a non-BERT family, not about accuracy.
    assert rows["pruned"]["params"] < rows["student"]["params"] < rows["baseline"]["params"]
    assert rows["onnx_int8"]["size_mb"] < rows["onnx"]["size_mb"] / 2
    stages = report["stages"]
    assert stages["student"]["result"]["student_layers"] == 2 and stages["student"]["result"]["not_smaller"] is None
    assert stages["pruned"]["result"]["heads_after"] == 6 and stages["pruned"]["result"]["ffn_after"] == 128
