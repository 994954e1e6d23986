import numpy as np
import pytest

from compress.recipe.schema import validate_recipe
from compress.run.runner import run_recipe
from tests.conftest import tiny_recipe


@pytest.fixture(scope="module")
def onnx_run(tiny_checkpoint, tiny_data, tmp_path_factory):
    """baseline -> export_onnx -> quantize_onnx (dynamic), benchmarked with 1 thread."""
    raw = tiny_recipe(tiny_checkpoint, tiny_data)
    raw["stages"] = [
        raw["stages"][0],
        {"id": "onnx", "uses": "export_onnx", "from": "baseline", "with": {"parity_examples": 48}},
        {"id": "onnx_int8", "uses": "quantize_onnx", "from": "onnx", "with": {"parity_examples": 64}},
    ]
    root = tmp_path_factory.mktemp("onnx_run")
    report = run_recipe(validate_recipe(raw), root, log=lambda m: None, threads=1)
    return report, root / "tiny"


def test_onnx_variants_run_in_the_bench_worker(onnx_run):
    report, _ = onnx_run
    rows = {r["id"]: r for r in report["rows"] if r["device"] == "cpu"}
    assert set(rows) == {"baseline", "onnx", "onnx_int8"}
    for vid in ("onnx", "onnx_int8"):
        assert rows[vid]["ok"], rows[vid].get("error")
        assert rows[vid]["format"] == "onnx" and rows[vid]["effective_device"] == "cpu"
        assert rows[vid]["latency_ms"]["p50"] > 0
    # The fp32 export predicts what its torch source predicts.
    assert abs(rows["onnx"]["accuracy"] - rows["baseline"]["accuracy"]) < 1e-9
    assert rows["onnx"]["params"] == rows["baseline"]["params"]


def test_dynamic_int8_is_smaller_and_mostly_agrees(onnx_run):
    report, run_dir = onnx_run
    rows = {r["id"]: r for r in report["rows"] if r["device"] == "cpu"}
    assert rows["onnx_int8"]["size_mb"] < 0.5 * rows["onnx"]["size_mb"]  # embeddings included
    assert rows["onnx_int8"]["accuracy"] >= rows["onnx"]["accuracy"] - 5
    result = report["stages"]["onnx_int8"]["result"]
    assert result["parity"]["label_agreement"] >= 90
    assert result["preset"] in ("avx2", "avx512", "avx512_vnni", "arm64") and result["preset_reason"]
    assert "Gather" in result["operators"]
    export = report["stages"]["onnx"]["result"]
    assert export["parity"]["label_agreement"] == 100.0


def test_predictor_reports_its_real_device_and_inputs(onnx_run):
    import onnxruntime as ort

    from compress.formats import load_predictor

    _, run_dir = onnx_run
    pred = load_predictor("onnx", run_dir / "onnx_int8", "cpu", 1)
    assert set(pred.input_names) <= {"input_ids", "attention_mask", "token_type_ids"}
    assert pred.int8 and pred.num_params() > 0 and pred.memory_bytes() > 0
    batch = {k: np.ones((2, 5), dtype=np.int64) for k in pred.input_names}
    assert pred(batch).shape == (2, 2)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        # Asked for cuda without a CUDA provider: onnxruntime falls back, and says so.
        pred = load_predictor("onnx", run_dir / "onnx", "cuda", 1)
        assert pred.effective_device == "cpu"
        assert any("CPU" in n for n in pred.notes)


def test_dynamic_int8_asked_for_cuda_runs_whole_on_the_cpu(onnx_run, monkeypatch):
    """A dynamic INT8 graph is never split between the CUDA provider and the CPU: its
    session is CPU-only and the predictor reports the fallback, with or without a GPU."""
    import onnxruntime as ort

    from compress.formats import load_predictor, onnx as onnx_fmt

    _, run_dir = onnx_run
    asked = []
    real_session = onnx_fmt.session
    monkeypatch.setattr(onnx_fmt, "session", lambda path, device, threads, **kw: asked.append(device) or real_session(path, device, threads, **kw))
    pred = load_predictor("onnx", run_dir / "onnx_int8", "cuda", 1)
    assert asked == ["cpu"]
    assert pred.session.get_providers() == ["CPUExecutionProvider"]
    assert pred.effective_device == "cpu" and any("no CUDA kernels" in n for n in pred.notes)
    # The fp32 export asks for CUDA (and falls back only where onnxruntime has no provider).
    pred = load_predictor("onnx", run_dir / "onnx", "cuda", 1)
    assert asked[-1] == "cuda"
    cuda_here = "CUDAExecutionProvider" in ort.get_available_providers()
    assert pred.effective_device == ("cuda" if cuda_here else "cpu")


def test_cpu_preset_reads_the_instruction_set(monkeypatch):
    from compress.stages import quantize_onnx

    monkeypatch.setattr(quantize_onnx.platform, "machine", lambda: "aarch64")
    assert quantize_onnx.cpu_preset()[0] == "arm64"
    monkeypatch.setattr(quantize_onnx.platform, "machine", lambda: "x86_64")

    class FakePath:
        def __init__(self, flags):
            self.flags = flags

        def read_text(self):
            return f"processor\t: 0\nflags\t\t: {self.flags}\n"

    for flags, preset in (("fpu avx avx2", "avx2"), ("avx2 avx512f avx512bw", "avx512"),
                          ("avx2 avx512f avx512bw avx512_vnni", "avx512_vnni")):
        monkeypatch.setattr(quantize_onnx, "Path", lambda p, f=flags: FakePath(f))
        assert quantize_onnx.cpu_preset()[0] == preset
