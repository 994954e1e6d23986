"""`compress load`: one-line errors (exit 2), and a tiny run served and measured under load
as a user runs it: `compress run` with a serving block deciding on $/month, then `compress
load` on the finished run; report.json gains its serving block (schema 7), the reports
render it, LoadGen's summary logs sit in the run folder."""

import json

import pytest

from compress.reports.report_json import SCHEMA_VERSION
from tests.conftest import tiny_recipe

FAST_LOAD = {"slo_ms": 1000.0, "percentile": 0.9, "min_duration_s": 2.0, "min_queries": 40, "timeout_s": 5.0,
             "start_qps": 16.0, "growth": 4.0, "max_runs": 2, "concurrency": 16}


def test_load_without_a_serving_block_or_a_run_is_one_line(cli, write_recipe, tiny_checkpoint, tiny_data, tmp_path):
    path = write_recipe(tiny_recipe(tiny_checkpoint, tiny_data))
    code, _, err = cli("load", tmp_path, "--recipe", path)
    assert code == 2 and "no `serving:` block" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("load", tmp_path / "nowhere")
    assert code == 2 and "no such report" in err
    code, out, _ = cli("load", "--help")
    assert code == 0 and "LoadGen" in out


def test_compress_load_measures_a_finished_run(cli, write_recipe, tiny_checkpoint, tiny_data, tmp_path):
    pytest.importorskip("mlperf_loadgen")
    pytest.importorskip("ray.serve")
    from compress.recipe.schema import validate_recipe
    from compress.run.runner import run_recipe

    raw = tiny_recipe(tiny_checkpoint, tiny_data)
    serving = {"server": {"max_batch_size": 8, "batch_wait_timeout_s": 0.01},
               "load": {**FAST_LOAD, "configurations": ["batched_cache"], "max_runs": 1},
               "traffic": {"peak_qps": 40, "mean_qps": 10, "peak_hours_per_day": 2,
                           "zipf": {"pool": 50, "exponent": 1.2, "seed": 1}}}
    # `compress run` with a serving block, deciding on $/month: the $/1K pick is served, and
    # the decision is made again on its plan.
    ran = run_recipe(validate_recipe({**raw, "serving": serving, "budget": {**raw["budget"],
                                                                            "objective": "min_monthly_cost"}}),
                     tmp_path / "art")
    run_dir = tmp_path / "art" / "tiny"
    assert ran["schema_version"] == SCHEMA_VERSION and ran["decision"]["objective"] == "min_monthly_cost"
    served = ran["serving"]["variant"]
    row = next(r for r in ran["rows"] if r["id"] == served)
    planned = bool(ran["serving"]["plan"]["rows"])
    assert (row.get("usd_per_month") is not None) == planned
    assert (ran["decision"]["selected"] == served) == planned  # the only variant with a $/month
    assert ran["timing"]["serving_seconds"] > 0

    raw["serving"] = {**serving, "load": {**FAST_LOAD, "configurations": ["unbatched", "batched_cache"]}}
    code, out, err = cli("load", run_dir, "--recipe", write_recipe(raw, "served.yaml"), "--variant", "int8")
    assert code == 0, err
    data = json.loads((run_dir / "report.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    s = data["serving"]
    assert s["variant"] == "int8" and [c["name"] for c in s["configs"]] == ["unbatched", "batched_cache"]
    assert all(c["runs"] and c["runs"][0]["target_qps"] == 16.0 for c in s["configs"])
    for c in s["configs"]:
        for r in c["runs"]:
            assert (run_dir / r["log_dir"] / "mlperf_log_summary.txt").is_file()
    assert s["traffic"]["duplicate_share_theory"] is not None and s["traffic"]["duplicate_share_sent"] is not None
    assert s["plan"]["pricing"]["on_demand_source"]
    assert (run_dir / "serving" / "serving.json").is_file()
    assert "### Serving" in (run_dir / "report.md").read_text()
    assert "latency against load" in (run_dir / "report.html").read_text()
    assert "Served under load" in out and "repeat a text asked before" in err + out
