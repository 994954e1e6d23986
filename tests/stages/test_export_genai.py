"""export_genai's failures: the builder's error says why it failed (its exception line), not
whatever it happened to print last. The builder itself is not run here (tests/formats/
test_genai.py builds real models)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from compress.core.errors import StageError
from compress.stages import export_genai

TRACEBACK = """\
Valid precision + execution provider combinations are: FP32 CPU, INT4 CPU
Traceback (most recent call last):
  File "/venv/lib/python3.12/site-packages/onnxruntime_genai/models/builder.py", line 4123, in create_model
    raise NotImplementedError(f"The {hf_name} model is not currently supported.")
NotImplementedError: The FooForCausalLM model is not currently supported.
/venv/lib/python3.12/site-packages/torch/cuda/__init__.py:63: FutureWarning: pynvml is deprecated
  import pynvml
"""


def _fail_with(monkeypatch, tmp_path: Path, returncode: int, stderr: str, stdout: str = "") -> str:
    monkeypatch.setattr(subprocess, "run", lambda cmd, **_: subprocess.CompletedProcess(cmd, returncode, stdout, stderr))
    ctx = SimpleNamespace(config=export_genai.Config(precision="fp32"), out=tmp_path / "out", stage_id="genai",
                          input=SimpleNamespace(path=tmp_path / "model"), log=lambda m: None)
    with pytest.raises(StageError) as exc:
        export_genai.run(ctx)
    return str(exc.value)


def test_a_failed_builder_shows_its_exception_line_not_its_last_line(monkeypatch, tmp_path):
    message = _fail_with(monkeypatch, tmp_path, 1, TRACEBACK)
    assert "(NotImplementedError: The FooForCausalLM model is not currently supported.)" in message, message
    assert "pynvml" not in message and "\n" not in message


def test_a_builder_chained_exception_shows_the_last_one(monkeypatch, tmp_path):
    chained = TRACEBACK.replace("/venv/lib/python3.12/site-packages/torch", "\nDuring handling of the above "
                                "exception, another exception occurred:\n\nTraceback (most recent call last):\n"
                                "  File \"x.py\", line 1, in <module>\nOSError: out of disk\n/venv/torch", 1)
    assert "OSError: out of disk" in _fail_with(monkeypatch, tmp_path, 1, chained)


def test_a_builder_killed_or_without_a_traceback_says_so(monkeypatch, tmp_path):
    assert "(killed by SIGKILL)" in _fail_with(monkeypatch, tmp_path, -9, "loading weights\n")
    assert "(error: no such option --foo)" in _fail_with(monkeypatch, tmp_path, 2, "usage: builder\nerror: no such option --foo\n")
    assert "(exit code 1, no output)" in _fail_with(monkeypatch, tmp_path, 1, "")
