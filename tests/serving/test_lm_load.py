"""A causal LM under load: the `serving_lm` settings validated, LoadGen's token latencies read
from a real LoadGen run's log, and `compress load --gguf` end to end: the real llama-server
(built by `compress llama-server`) on a tiny random GGUF file, a request at a time and with
continuous batching, driven by MLPerf LoadGen's server scenario over HTTP with TTFT and TPOT
constraints."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from compress.core.errors import RecipeError
from compress.recipe.schema import load_recipe
from compress.recipe.serving import LmServingSpec
from compress.serving.records import LmConfigFigures, LmServingReport, Search, TokenRun


# --- the settings --------------------------------------------------------------------------


def test_the_settings_refuse_unknown_keys_and_impossible_values():
    assert LmServingSpec().configurations == ["unbatched", "batched"]
    with pytest.raises(ValidationError, match="extra"):
        LmServingSpec(ttft=1)
    with pytest.raises(ValidationError, match="max_tokens"):
        LmServingSpec(max_tokens=1)  # TPOT needs a second token
    with pytest.raises(ValidationError, match="parallel"):
        LmServingSpec(parallel=1)  # one slot is the unbatched configuration
    with pytest.raises(ValidationError, match="named twice"):
        LmServingSpec(configurations=["batched", "batched"])
    with pytest.raises(ValidationError, match="percentile"):
        LmServingSpec(percentile=0.85)  # LoadGen logs p90, p95, p97, p99, p99.9


def _recipe(tmp_path: Path, task: str, block: dict) -> Path:
    raw = {"schema_version": 1, "name": "r", "task": task, "model": {"source": "x.gguf"},
           "stages": [{"id": "g", "uses": "quantize_gguf", "from": "model", "with": {"type": "source"}}],
           "budget": {"baseline": "model"}, **block}
    if task == "sequence-classification":
        raw["data"] = {"dataset": str(tmp_path)}
        raw["stages"] = [{"id": "onnx", "uses": "export_onnx", "from": "model"}]
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def test_the_block_is_read_on_causal_lm_recipes_only(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    r = load_recipe(_recipe(tmp_path, "causal-lm", {"serving_lm": {"parallel": 8, "ttft_ms": 500}}))
    assert r.serving_lm.parallel == 8 and r.serving_lm.ttft_ms == 500 and r.serving_lm.tpot_ms == 200
    with pytest.raises(RecipeError, match="serving_lm.tpot_ms"):
        load_recipe(_recipe(tmp_path, "causal-lm", {"serving_lm": {"tpot_ms": -1}}))
    with pytest.raises(RecipeError, match="only causal-lm recipes take a `serving_lm` block"):
        load_recipe(_recipe(tmp_path, "sequence-classification", {"serving_lm": {}}))


def test_the_headline_is_the_highest_valid_run_and_its_cost():
    from compress.serving.lm_load import _headline, usd_per_1m_tokens

    spec = LmServingSpec()
    run = dict(queries=44, seconds=10.0, log_dir="x", loadgen_valid=True)
    fig = LmConfigFigures(name="batched", parallel=4, runs=[
        TokenRun(target_qps=1.0, valid=True, output_tokens_per_s=32.0, ttft_p99_ms=100.0, **run),
        TokenRun(target_qps=2.0, valid=True, output_tokens_per_s=64.0, ttft_p99_ms=300.0, **run),
        TokenRun(target_qps=4.0, valid=False, output_tokens_per_s=90.0, ttft_p99_ms=9000.0, **run)])
    fig.search = Search(tried=[(1.0, True), (2.0, True), (4.0, False)], max_valid_qps=2.0, lowest_invalid_qps=4.0)
    _headline(fig, spec)
    assert fig.max_valid_qps == 2.0 and fig.output_tokens_per_s == 64.0 and fig.ttft_p99_ms == 300.0
    # $0.085 an hour for 64 tokens a second: 230,400 tokens an hour.
    assert fig.usd_per_1m_output_tokens == pytest.approx(0.085 / 230_400 * 1e6)
    assert usd_per_1m_tokens(1.0, 1e6 / 3600) == pytest.approx(1.0)
    assert not fig.notes


# --- LoadGen's token latencies, from a real LoadGen run -------------------------------------


def test_token_latencies_are_read_from_loadgens_log(tmp_path):
    """A SUT whose first token comes after 40 ms and whose 9 more tokens take 5 ms each: LoadGen
    measures and logs it, and read_detail_log gives back the TTFT, the TPOT and the tokens/s."""
    lg = pytest.importorskip("mlperf_loadgen")
    from compress.serving.load import read_detail_log

    def work(s):
        time.sleep(0.04)
        lg.FirstTokenComplete([lg.QuerySampleResponse(s.id, 0, 0)])
        time.sleep(0.045)
        lg.QuerySamplesComplete([lg.QuerySampleResponse(s.id, 0, 0, 10)])

    settings = lg.TestSettings()
    settings.scenario, settings.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    settings.server_target_qps, settings.min_duration_ms, settings.min_query_count = 20.0, 1000, 44
    settings.use_token_latencies, settings.ttft_latency, settings.tpot_latency = True, int(1e9), int(1e8)
    settings.server_target_latency_percentile = 0.9
    out = lg.LogOutputSettings()
    out.outdir, out.copy_summary_to_stdout = str(tmp_path), False
    logs = lg.LogSettings()
    logs.log_output, logs.enable_trace = out, False
    qsl = lg.ConstructQSL(4, 4, lambda i: None, lambda i: None)
    sut = lg.ConstructSUT(lambda ss: [threading.Thread(target=work, args=(s,)).start() for s in ss], lambda: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, logs)
    finally:
        lg.DestroySUT(sut)
        lg.DestroyQSL(qsl)
    res = read_detail_log(tmp_path / "mlperf_log_detail.txt")
    assert res.validity == "VALID" and res.early_stopping_ttft and res.early_stopping_tpot
    assert 38 <= res.ms(50.0, "ttft") < 80
    assert 4.5 <= res.ms(50.0, "tpot") < 9  # (latency - ttft) / (tokens - 1)
    assert res.ms(99.0, "tpot") >= res.ms(50.0, "tpot")
    assert res.tokens_per_s == pytest.approx(10 * res.completed_qps, rel=0.05)
    assert res.ms(50.0) > res.ms(50.0, "ttft")  # the whole query is longer than its first token


# --- llama-server under LoadGen, end to end ---------------------------------------------------


def _server():
    from compress.serving import llama_server

    return llama_server.find()


needs_server = pytest.mark.skipif(
    _server() is None, reason="llama-server is not built: run `compress llama-server` (README, Install)")


@needs_server
def test_compress_load_serves_a_gguf_file_batched_and_one_request_at_a_time(tmp_path):
    pytest.importorskip("mlperf_loadgen")
    from tests.tasks.causal_lm.test_gguf import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "model", name="tiny.gguf")
    dialogues = tmp_path / "dialogues.jsonl"
    with dialogues.open("w", encoding="utf-8") as f:
        for i in range(6):
            f.write(json.dumps({"id": f"d{i}", "dialogue": f"Ann: hello {i}\nBob: hi there, {'see you ' * i}"}) + "\n")
    recipe = {"schema_version": 1, "name": "tiny_lm", "task": "causal-lm", "model": {"source": str(gguf)},
              "lm": {"timing": {"prompts": 2, "path": str(dialogues)}},
              "stages": [{"id": "g", "uses": "quantize_gguf", "from": "model", "with": {"type": "source"}}],
              "budget": {"baseline": "model"},
              "serving_lm": {"parallel": 2, "max_tokens": 8, "prompts": 6, "ctx_per_slot": 256, "threads": 1,
                             "min_duration_s": 1.0, "max_runs": 2, "ttft_ms": 5000, "tpot_ms": 1000}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe), encoding="utf-8")
    out = tmp_path / "served"
    proc = subprocess.run([sys.executable, "-m", "compress", "load", str(out), "--recipe", str(tmp_path / "r.yaml"),
                           "--gguf", str(gguf)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = LmServingReport.model_validate_json((out / "serving_lm" / "serving_lm.json").read_text())
    assert rep.engine.startswith("llama-server version") and rep.max_tokens == 8 and rep.prompts == 6
    assert [c.name for c in rep.configs] == ["unbatched", "batched"]
    assert [c.parallel for c in rep.configs] == [1, 2]
    for c in rep.configs:
        assert c.error is None and c.runs and c.search is not None
        assert len(c.runs) <= 2 and c.max_valid_qps is not None  # SLOs far above a tiny model's latency
        first = c.runs[0]
        assert first.valid and first.failed == 0 and first.queries >= 44  # early stopping at p90
        assert first.mean_output_tokens == 8  # eos ignored: every request the same length
        assert first.mean_prompt_tokens > 20  # the dialogue, chat-templated by the server
        assert 0 < first.ttft_p50_ms <= first.ttft_p99_ms and 0 < first.tpot_p50_ms <= first.tpot_p99_ms
        assert first.output_tokens_per_s == pytest.approx(8 * first.completed_qps, rel=0.1)
        assert c.usd_per_1m_output_tokens > 0
        logs = out / first.log_dir
        assert "Result is : VALID" in (logs / "mlperf_log_summary.txt").read_text()
        assert "TTFT Early Stopping Result" in (logs / "mlperf_log_summary.txt").read_text()
        assert (out / "serving_lm" / c.name / "figures.json").is_file()
    assert "max valid" in proc.stderr + proc.stdout and "per 1M output tokens" in proc.stderr + proc.stdout


@needs_server
def test_a_server_that_cannot_start_is_named_with_its_log(tmp_path):
    from compress.core.errors import CompressError
    from compress.serving import llama_server

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(CompressError, match="llama-server exited with code .* its log is"):
        llama_server.LlamaServer(_server(), bad, 1, 256, 1, tmp_path / "log.txt", start_timeout_s=60)
    assert (tmp_path / "log.txt").stat().st_size > 0


def test_without_llama_server_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    from compress.serving import llama_server

    monkeypatch.setenv(llama_server.CACHE_ENV, str(tmp_path / "empty"))
    monkeypatch.delenv(llama_server.BINARY_ENV, raising=False)
    with pytest.raises(llama_server.LlamaServerMissing, match="run `compress llama-server`"):
        llama_server.require()
    monkeypatch.setenv(llama_server.BINARY_ENV, str(tmp_path / "nothing"))
    with pytest.raises(llama_server.LlamaServerMissing, match="no executable file there"):
        llama_server.require()
