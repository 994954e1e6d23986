"""The command line: every exit code, one-line errors that name the key, cached re-runs."""

import json
import subprocess
import sys

from tests.conftest import ROOT, tiny_recipe


def test_help_and_stages(cli):
    code, out, _ = cli("--help")
    assert code == 0 and "run" in out and "validate" in out
    code, out, _ = cli("stages")
    assert code == 0 and "finetune" in out and "quantize_dynamic" in out
    code, out, _ = cli("stages", "finetune")
    assert code == 0 and "warmup_ratio" in out and "Peak learning rate" in out


def test_validate_ok_and_errors_name_the_key(cli, write_recipe, tiny_checkpoint, tiny_data):
    r = tiny_recipe(tiny_checkpoint, tiny_data)
    path = write_recipe(r)
    code, out, _ = cli("validate", path)
    assert code == 0 and "valid" in out
    r["stages"][0]["with"]["temperature"] = 2
    path = write_recipe(r, "bad.yaml")
    code, _, err = cli("validate", path)
    assert code == 2
    assert "bad.yaml: stages[0].with.temperature: unknown key" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_usage_errors_exit_2(cli):
    assert cli("nonsense")[0] == 2
    assert cli("run")[0] == 2
    code, _, err = cli("validate", "missing.yaml")
    assert code == 2 and "no such file" in err


def test_set_override_on_the_command_line(cli, write_recipe, tiny_checkpoint, tiny_data):
    path = write_recipe(tiny_recipe(tiny_checkpoint, tiny_data))
    code, _, err = cli("validate", path, "--set", "stages[0].with.lr=fast")
    assert code == 2 and "stages[0].with.lr" in err
    assert cli("validate", path, "--set", "stages.baseline.with.lr=0.01")[0] == 0


def test_unexpected_error_exits_1_and_debug_shows_traceback(cli, write_recipe, tiny_checkpoint, tiny_data, monkeypatch):
    import compress.run.runner

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(compress.run.runner, "run_recipe", boom)
    path = write_recipe(tiny_recipe(tiny_checkpoint, tiny_data))
    code, _, err = cli("run", path)
    assert code == 1 and "kaboom" in err and "--debug" in err and "Traceback" not in err


def test_run_gate_report_and_cached_rerun(cli, write_recipe, tiny_checkpoint, tiny_data, tmp_path):
    """One tiny run exercises exit 0 and 3, the gate, re-rendering and the cache."""
    path = write_recipe(tiny_recipe(tiny_checkpoint, tiny_data))
    art = tmp_path / "art"
    code, out, err = cli("run", path, "--artifacts", art)
    assert code == 0, err
    assert "deploy: int8" in out
    run_dir = art / "tiny"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["decision"]["selected"] == "int8"
    assert {r["id"] for r in report["rows"]} == {"baseline", "int8"}
    assert report["manifest"]["data"]["fingerprint"] and report["manifest"]["versions"]["torch"]
    assert (run_dir / "report.md").read_text().startswith("## compress: tiny")

    # Nothing changed: every stage and measurement is reused.
    code, out, err = cli("run", path, "--artifacts", art)
    assert code == 0
    assert err.count("reused") == 2 and err.count("cached") == 2

    # An impossible budget: no compressed variant passes -> exit 3, the closest one is named.
    code, out, err = cli("run", path, "--artifacts", art, "--set", "budget.max_accuracy_drop=0",
                         "--set", "budget.max_size_mb=0.001")
    assert code == 3
    assert "no compressed variant is within budget" in out
    report = json.loads((run_dir / "report.json").read_text())
    assert report["decision"]["selected"] is None and report["decision"]["best_failed"]["id"] == "int8"

    assert cli("gate", run_dir, "--variant", "int8", "--max-drop", "100")[0] == 0
    code, out, _ = cli("gate", run_dir, "--variant", "int8", "--max-drop", "-0.0001")
    assert code == 2  # a negative budget is bad usage
    code, _, err = cli("gate", run_dir, "--variant", "nope")
    assert code == 2 and "known: baseline, int8" in err
    code, out, _ = cli("report", run_dir)
    assert code == 0 and "int8" in out

    # --force re-runs one stage only.
    code, _, err = cli("run", path, "--artifacts", art, "--force", "int8")
    assert "[int8] quantize_dynamic: running (forced)" in err and "[baseline] finetune: up to date" in err
    # ... and the baseline is measured again with it: speed-ups come from one session.
    assert "speed-ups come from one session" in err
    assert "baseline on cpu: measuring" in err and "int8 on cpu: measuring" in err and "cached" not in err
    assert cli("run", path, "--artifacts", art, "--force", "nope")[0] == 2

    # A second latency round times int8 alternately with the baseline, in a fresh process:
    # its speed-up is that pair's, and the baseline's latency counts the pair's timings too.
    code, _, err = cli("run", path, "--artifacts", art, "--set", "benchmark.latency_rounds=2")
    assert code == 0 and "timed alternately with baseline" in err, err
    bench = json.loads((run_dir / "bench" / "int8.cpu.json").read_text())
    [ratio] = bench["paired_speedup"]["rounds"]
    report = json.loads((run_dir / "report.json").read_text())
    rows = {r["id"]: r for r in report["rows"]}
    assert rows["int8"]["speedup_vs_baseline"] == ratio > 0 and rows["int8"]["paired_vs_baseline"]
    assert len(rows["baseline"]["latency_rounds_p50"]) == len(rows["int8"]["latency_rounds_p50"]) == 2
    assert "alternately with the baseline" in (run_dir / "report.md").read_text()


def test_rebuilt_input_reruns_its_dependants_only_when_its_files_differ(
        cli, write_recipe, tiny_checkpoint, tiny_data, tmp_path, monkeypatch):
    import dataclasses

    from compress.core.registry import registry

    STAGES = registry()  # the registry's own dict: a change to it is seen by get_stage

    path = write_recipe(tiny_recipe(tiny_checkpoint, tiny_data))
    art = tmp_path / "art"
    assert cli("run", path, "--artifacts", art)[0] == 0
    # Training here is seeded and deterministic: a forced rebuild writes the same files, and
    # the INT8 model made from them is still valid.
    code, _, err = cli("run", path, "--artifacts", art, "--force", "baseline")
    assert code == 0 and "[baseline] finetune: running (forced)" in err
    assert "[int8] quantize_dynamic: up to date" in err
    # A rebuild that writes other weights (as GPU training may) makes the INT8 model stale.
    finetune = STAGES["finetune"]

    def perturbed(ctx):
        result = finetune.run(ctx)
        (ctx.out / "extra.txt").write_text("another run")
        return result

    monkeypatch.setitem(STAGES, "finetune", dataclasses.replace(finetune, run=perturbed))
    code, _, err = cli("run", path, "--artifacts", art, "--force", "baseline")
    assert code == 0 and "[int8] quantize_dynamic: running (inputs or settings changed)" in err


def test_cli_starts_without_heavy_imports():
    code = ("import sys; sys.argv=['compress','--help']; import compress.cli.main as c\n"
            "try:\n    c.main()\nexcept SystemExit: pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_only_the_first_sigterm_interrupts_so_the_clean_up_runs_to_its_end(monkeypatch):
    """SIGTERM becomes KeyboardInterrupt once; another one while the run stops (a CI runner
    or a supervisor often sends several) is not raised into that clean-up, which would leave
    the benchmark worker running and end in a traceback instead of the one line (exit 143)."""
    import signal

    import pytest

    from compress.cli import main as cli_mod

    monkeypatch.setattr(cli_mod, "_state", {"debug": False})
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, cli_mod._on_sigterm)
        with pytest.raises(KeyboardInterrupt):
            cli_mod._on_sigterm(signal.SIGTERM, None)
        cli_mod._on_sigterm(signal.SIGTERM, None)  # during the clean-up: no second interrupt
        # Ignored from here to the exit: Python puts the default action back for its own handlers
        # when the interpreter shuts down, and a SIGTERM then would kill the run (-15).
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        with pytest.raises(SystemExit) as exc:
            cli_mod._interrupted()
        assert exc.value.code == 143
    finally:
        signal.signal(signal.SIGTERM, before)
