"""compress.techniques.train: the shared loop's precision setting (the loop itself is covered by every training stage)."""

import torch

from tests.conftest import run_stage


def _linear_dtypes(monkeypatch):
    """Records the dtype of every nn.Linear output while training runs."""
    seen = set()
    original = torch.nn.Linear.forward

    def forward(self, x):
        y = original(self, x)
        seen.add(y.dtype)
        return y

    monkeypatch.setattr(torch.nn.Linear, "forward", forward)
    return seen


def test_bf16_trains_under_autocast_and_saves_fp32_weights(tiny_checkpoint, tiny_data, tmp_path, monkeypatch):
    from transformers import AutoModelForSequenceClassification

    seen = _linear_dtypes(monkeypatch)
    result = run_stage(tiny_checkpoint, tiny_data, tmp_path / "bf16", "finetune",
                       {"precision": "bf16", "epochs": 1, "lr": 3e-3, "batch_size": 16, "max_length": 32})
    assert torch.bfloat16 in seen and result.train["final_loss"] == result.train["final_loss"]  # not NaN
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "bf16", use_safetensors=True)
    assert {p.dtype for p in model.parameters()} == {torch.float32}

    seen.clear()
    run_stage(tiny_checkpoint, tiny_data, tmp_path / "fp32", "finetune",
              {"epochs": 1, "lr": 3e-3, "batch_size": 16, "max_length": 32})
    assert seen == {torch.float32}


def test_the_recipe_precision_wins_over_accelerates_environment(tiny_checkpoint, tiny_data, tmp_path, monkeypatch):
    """`accelerate launch` exports the user's mixed precision (often fp16); training keeps
    to the recipe's `precision` all the same."""
    from accelerate.state import AcceleratorState

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    seen = _linear_dtypes(monkeypatch)
    run_stage(tiny_checkpoint, tiny_data, tmp_path / "fp32", "finetune",
              {"epochs": 0.2, "batch_size": 16, "max_length": 32})
    assert seen == {torch.float32}
    assert AcceleratorState().mixed_precision == "no"


def test_cuda_bf16_is_native_from_compute_capability_8(monkeypatch):
    """T4 and V100 (capability 7.x) emulate bfloat16 although torch can make bf16 tensors there."""
    import torch

    from compress.techniques.train import bf16_native

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert bf16_native("cuda") is False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert bf16_native("cuda") is True


def test_emulated_bf16_is_announced(tiny_checkpoint, tiny_data, tmp_path, monkeypatch):
    import compress.techniques.train as train_mod

    monkeypatch.setattr(train_mod, "bf16_native", lambda device: False)
    logged = []
    run_stage(tiny_checkpoint, tiny_data, tmp_path / "out", "finetune",
              {"precision": "bf16", "epochs": 0.1, "batch_size": 16, "max_length": 32}, log=logged.append)
    assert any("emulated" in m for m in logged)


def test_auto_precision_follows_the_device(tiny_checkpoint, tiny_data, tmp_path, monkeypatch):
    """`precision: auto` trains in bf16 where the device has native bfloat16, else in fp32."""
    import compress.techniques.train as train

    seen = _linear_dtypes(monkeypatch)
    settings = {"precision": "auto", "epochs": 1, "lr": 3e-3, "batch_size": 16, "max_length": 32}
    monkeypatch.setattr(train, "bf16_native", lambda device: False)
    run_stage(tiny_checkpoint, tiny_data, tmp_path / "no_bf16", "finetune", settings)
    assert seen == {torch.float32}

    seen.clear()
    monkeypatch.setattr(train, "bf16_native", lambda device: True)
    run_stage(tiny_checkpoint, tiny_data, tmp_path / "bf16", "finetune", settings)
    assert torch.bfloat16 in seen
