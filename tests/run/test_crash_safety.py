"""A run killed anywhere resumes: finished stages are reused, half-written outputs are
never trusted, corrupt outputs are rebuilt (or refused with --no-rebuild), a full disk and
Ctrl-C end with one line, and two runs of one recipe never interleave.

The kills are real: `python -m compress run` in its own process group, SIGKILLed at a
chosen point. COMPRESS_TEST_PAUSE_IN=<stage id> holds the run after that stage has written
its output into the temporary folder but before the commit (the moment a complete-looking,
uncommitted output exists); the benchmark is caught by polling for its job file.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_recipe
from tests.tasks.causal_lm.test_data import data  # noqa: F401 - the fixture: tiny copies of the LM eval sets


def _env(**extra) -> dict:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1"})
    env.pop("COMPRESS_TEST_PAUSE_IN", None)
    env.update(extra)
    return env


def start(cwd: Path, *args: str, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "compress", "run", "recipe.yaml", *args], cwd=cwd, env=_env(**env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        # A shell's background job inherits SIGINT ignored: give the run Ctrl-C back.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def wait_for(proc: subprocess.Popen, pattern: str, root: Path, timeout: float = 180) -> Path:
    """Polls for a file matching `pattern` under `root` while `proc` runs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        hits = sorted(root.glob(pattern))
        if hits:
            return hits[0]
        if proc.poll() is not None:
            raise AssertionError(f"run ended ({proc.returncode}) before {pattern} appeared:\n{proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{pattern} did not appear in {timeout}s")


def kill(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    os.killpg(proc.pid, sig)  # the whole group: a benchmark worker dies with the run
    proc.wait(timeout=60)


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("error: "), err
    return lines[-1]


def leftovers(run_dir: Path) -> list[Path]:
    tmp = run_dir / ".tmp"
    return list(tmp.iterdir()) if tmp.exists() else []


def committed(run_dir: Path) -> set[str]:
    return {p.parent.name for p in run_dir.glob("*/_complete.json")}


@pytest.fixture
def workdir(tmp_path, tiny_checkpoint, tiny_data) -> Path:
    recipe = tiny_recipe(tiny_checkpoint, tiny_data)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return tmp_path


def test_kill_in_each_kind_of_stage_then_resume(workdir, cli, monkeypatch):
    run_dir = workdir / "artifacts" / "tiny"

    # 1. Training: killed once its weights are written but before the commit. Meanwhile a
    #    second run of the same recipe is refused and touches nothing.
    p = start(workdir, COMPRESS_TEST_PAUSE_IN="baseline")
    tmp_out = wait_for(p, ".tmp/baseline-*/model.safetensors", run_dir).parent
    second = subprocess.run([sys.executable, "-m", "compress", "run", "recipe.yaml"], cwd=workdir, env=_env(),
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 2
    assert "another run of this recipe is in progress" in one_line_error(second.stderr)
    assert tmp_out.is_dir(), "the refused run swept the running one's folder"
    kill(p)
    assert committed(run_dir) == set() and not (run_dir / "baseline").exists()

    # 2. Quantization: the half-finished run's temporary folder is swept and the training
    #    stage runs again (nothing of it was committed); then killed inside quantize_dynamic.
    p = start(workdir, COMPRESS_TEST_PAUSE_IN="int8")
    wait_for(p, ".tmp/int8-*/quantized.safetensors", run_dir)
    assert not (run_dir / ".tmp" / tmp_out.name).exists()
    kill(p)
    assert committed(run_dir) == {"baseline"}

    # 3. Benchmark: killed while the first variant is measured (its job file exists).
    p = start(workdir)
    wait_for(p, "bench/*.spec.json", run_dir)
    kill(p)
    assert committed(run_dir) == {"baseline", "int8"}
    assert not list((run_dir / "bench").glob("*.cpu.json")), "a killed measurement was recorded"

    # 4. Ctrl-C in the benchmark: exit 130 with one line.
    for stale in (run_dir / "bench").glob("*.spec.json"):  # left by the kill: wait for a new one
        stale.unlink()
    p = start(workdir)
    wait_for(p, "bench/*.spec.json", run_dir)
    kill(p, signal.SIGINT)
    code, err = finish(p)
    assert code == 130, err
    assert "interrupted; run again to resume" in one_line_error(err)

    # 5. The re-run completes, reusing every finished stage (in-process from here on: fast).
    monkeypatch.chdir(workdir)
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    assert "[baseline] finetune: up to date (reused)" in err and "[int8] quantize_dynamic: up to date (reused)" in err
    assert not leftovers(run_dir)
    report = json.loads((run_dir / "report.json").read_text())
    assert {r["id"] for r in report["rows"]} == {"baseline", "int8"} and all(r["ok"] for r in report["rows"])

    # 6. Nothing changed: everything, the benchmark included, is reused.
    t0 = time.perf_counter()
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0 and err.count("up to date (reused)") == 2 and err.count("measured before (cached)") == 2, err
    assert "running" not in err and "measuring" not in err
    assert time.perf_counter() - t0 < 120

    # 7. A truncated weight file: --no-rebuild refuses in one line naming the stage and why;
    #    a plain run rebuilds that stage only.
    weights = run_dir / "int8" / "quantized.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, err = cli("run", "recipe.yaml", "--no-rebuild")
    assert code == 2
    line = one_line_error(err)
    assert "[int8]" in line and "corrupt" in line and "--no-rebuild" in line
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    assert "[int8] quantize_dynamic: running (files changed since it was written (corrupt or edited))" in err
    assert "[baseline] finetune: up to date (reused)" in err

    # 8. One byte edited in place (same size) is caught as well.
    weights = run_dir / "baseline" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    code, _, err = cli("run", "recipe.yaml", "--no-rebuild")
    assert code == 2 and "[baseline]" in one_line_error(err)

    # 9. --force re-runs one stage (and --force with --no-rebuild is refused).
    code, _, err = cli("run", "recipe.yaml", "--force", "int8")
    assert code == 0, err
    assert "[int8] quantize_dynamic: running (forced)" in err and "[baseline] finetune: running" in err
    code, _, err = cli("run", "recipe.yaml", "--force", "int8")
    assert "[int8] quantize_dynamic: running (forced)" in err and "[baseline] finetune: up to date" in err
    assert cli("run", "recipe.yaml", "--force", "int8", "--no-rebuild")[0] == 2


def _classifier_only(tiny_classifier, tiny_data) -> dict:
    """No training: quantize the (already classifying) model and compare with it."""
    recipe = tiny_recipe(tiny_classifier, tiny_data)
    recipe["stages"] = [{"id": "int8", "uses": "quantize_dynamic",
                         "with": {"mode": "all", "calibration_examples": 32}}]
    recipe["budget"] = {"baseline": "model", "max_accuracy_drop": 100}
    return recipe


def test_full_disk_leaves_no_trusted_output(tmp_path, tiny_classifier, tiny_data, cli, monkeypatch):
    import safetensors.torch

    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_classifier_only(tiny_classifier, tiny_data)))
    monkeypatch.chdir(tmp_path)
    real = safetensors.torch.save_file
    written = []

    def full_disk(tensors, filename, *a, **kw):
        if written:  # the first file goes through, the second finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filename))
        written.append(filename)
        return real(tensors, filename, *a, **kw)

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    code, _, err = cli("run", "recipe.yaml")
    assert code == 2, err
    line = one_line_error(err)
    assert "no space left on the device" in line and "free some space" in line
    run_dir = tmp_path / "artifacts" / "tiny"
    assert written and not (run_dir / "int8").exists()
    assert not leftovers(run_dir), "a partial output was left behind"
    # The same through the message only (safetensors' Rust writer reports no errno).
    from compress.cli.main import _disk_problem

    assert _disk_problem(RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })"))
    assert _disk_problem(OSError(errno.EROFS, "Read-only file system", "x")).startswith("read-only")
    assert _disk_problem(ValueError("something else")) is None


def test_ctrl_c_inside_a_stage_then_resume(tmp_path, tiny_classifier, tiny_data, cli, monkeypatch):
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_classifier_only(tiny_classifier, tiny_data)))
    run_dir = tmp_path / "artifacts" / "tiny"
    p = start(tmp_path, COMPRESS_TEST_PAUSE_IN="int8")
    wait_for(p, ".tmp/int8-*/quantized.safetensors", run_dir)
    kill(p, signal.SIGINT)
    code, err = finish(p)
    assert code == 130 and "interrupted; run again to resume" in one_line_error(err)
    assert committed(run_dir) == set() and not leftovers(run_dir)
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("run", "recipe.yaml")
    assert code == 0, err
    assert "[int8] quantize_dynamic: running (no output yet)" in err and committed(run_dir) == {"int8"}


def kill_then_resume(cwd: Path, run_dir: Path, cli, monkeypatch, sid: str, kind: str, pattern: str,
                     codes: tuple[int, ...] = (0,), timeout: float = 180, **env) -> None:
    """kill -9 `compress run` in `cwd` the moment `pattern` appears under run_dir: nothing is
    committed, --no-rebuild refuses in one line, and a plain run rebuilds stage `sid` alone."""
    p = start(cwd, **env)
    wait_for(p, pattern, run_dir, timeout=timeout)
    kill(p)
    assert committed(run_dir) == set()

    monkeypatch.chdir(cwd)
    code, _, err = cli("run", "recipe.yaml", "--no-rebuild")
    assert code == 2 and f"[{sid}] {kind}: no output yet" in one_line_error(err)
    code, _, err = cli("run", "recipe.yaml")
    assert code in codes, err
    assert f"[{sid}] {kind}: running (no output yet)" in err and committed(run_dir) == {sid}


def test_kill_in_export_then_resume_and_a_corrupt_onnx_file(tmp_path, tiny_classifier, tiny_data, cli, monkeypatch):
    from compress.core.registry import registry

    if "export_onnx" not in registry():
        pytest.skip("no export_onnx stage")
    recipe = tiny_recipe(tiny_classifier, tiny_data)
    recipe["stages"] = [{"id": "onnx", "uses": "export_onnx", "with": {"parity_examples": 16, "max_length": 32}}]
    recipe["budget"] = {"baseline": "model", "max_accuracy_drop": 100}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / "artifacts" / "tiny"

    kill_then_resume(tmp_path, run_dir, cli, monkeypatch, "onnx", "export_onnx", ".tmp/onnx-*/*.onnx",
                     COMPRESS_TEST_PAUSE_IN="onnx")

    graph = next((run_dir / "onnx").glob("*.onnx"))
    data = bytearray(graph.read_bytes())
    data[len(data) // 3] ^= 0xFF
    graph.write_bytes(bytes(data))
    code, _, err = cli("run", "recipe.yaml", "--no-rebuild")
    assert code == 2
    line = one_line_error(err)
    assert "[onnx]" in line and "corrupt" in line


def test_kill_in_openvino_export_then_resume_and_a_tampered_ir(tmp_path, tiny_classifier, tiny_data, cli, monkeypatch):
    """kill -9 the moment export_openvino's IR appears (perhaps halfway through writing it):
    nothing is committed and the resume rebuilds it; an IR edited in place afterwards (an
    external entity in model.xml, a short model.bin) is never used: --no-rebuild refuses in
    one line, a plain run rebuilds it."""
    from compress.core.registry import registry

    pytest.importorskip("openvino")
    if "export_openvino" not in registry():
        pytest.skip("no export_openvino stage")
    recipe = tiny_recipe(tiny_classifier, tiny_data)
    recipe["stages"] = [{"id": "ov", "uses": "export_openvino", "with": {"parity_examples": 16, "max_length": 32}}]
    recipe["budget"] = {"baseline": "model", "max_accuracy_drop": 100}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run_dir = tmp_path / "artifacts" / "tiny"

    kill_then_resume(tmp_path, run_dir, cli, monkeypatch, "ov", "export_openvino", ".tmp/ov-*/model.xml")

    def entity(folder: Path) -> None:
        xml = folder / "model.xml"
        head, _, rest = xml.read_text().partition("?>")
        xml.write_text(head + '?>\n<!DOCTYPE net [<!ENTITY leak SYSTEM "file:///etc/passwd">]>' + rest)

    def short_bin(folder: Path) -> None:
        weights = folder / "model.bin"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    for damage in (entity, short_bin):
        damage(run_dir / "ov")
        code, _, err = cli("run", "recipe.yaml", "--no-rebuild")
        assert code == 2, err
        line = one_line_error(err)
        assert "[ov]" in line and "corrupt" in line
        code, _, err = cli("run", "recipe.yaml")
        assert code == 0, err
        assert "[ov] export_openvino: running (files changed since it was written (corrupt or edited))" in err
    assert not leftovers(run_dir)


def test_kill_in_onnx_lm_export_then_resume(data, tmp_path, cli, monkeypatch):  # noqa: F811
    """The same for a causal LM's export_onnx_lm: killed the moment its graph appears,
    nothing is committed; the resume exports again and the run reaches its decision."""
    from compress.core.registry import registry
    from tests.lm_fixtures import tiny_causal
    from tests.run.test_lm_run import _recipe

    pytest.importorskip("optimum")
    if "export_onnx_lm" not in registry():
        pytest.skip("no export_onnx_lm stage")
    recipes = data  # the tiny copies of the eval sets, and the folder for the recipe
    model = tiny_causal(tmp_path / "tiny_llama")
    path = _recipe(recipes, model, [{"id": "onnx", "uses": "export_onnx_lm", "with": {"parity_prompts": 2,
                                                                                       "parity_new_tokens": 4}}],
                   max_perplexity_increase=100)
    path.rename(recipes / "recipe.yaml")
    run_dir = recipes / "artifacts" / "tiny_lm"

    # A decision either way (0 or 3): the tiny random model need not meet the budget.
    kill_then_resume(recipes, run_dir, cli, monkeypatch, "onnx", "export_onnx_lm", ".tmp/onnx-*/*.onnx",
                     codes=(0, 3), timeout=300)
    assert not leftovers(run_dir)


def _workers(run_dir: Path) -> list[int]:
    """Pids of live benchmark workers of this run (their command line names its bench folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in (proc / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if "compress.bench.worker" in cmd and str(run_dir) in cmd and "Z" not in state.split()[1:2]:
            pids.append(int(proc.name))
    return pids


def _gone(pids: list[int], run_dir: Path, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not set(pids) & set(_workers(run_dir)):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_or_sigkill_of_the_run_takes_its_benchmark_worker_with_it(tmp_path, tiny_classifier, tiny_data):
    """Only the main process is signalled (as a CI runner or `kill PID` does, not the group):
    SIGTERM ends the run with one line and exit 143, SIGKILL leaves no orphan; either way the
    worker stops instead of writing on into bench/."""
    recipe = tiny_recipe(tiny_classifier, tiny_data)
    recipe["stages"] = [{"id": "int8", "uses": "quantize_dynamic", "with": {"calibration_examples": 16, "sensitivity_examples": 8}}]
    recipe["budget"] = {"baseline": "model", "max_accuracy_drop": 5.0}
    recipe["benchmark"]["max_latency_examples"] = 96
    recipe["benchmark"]["latency_repeats"] = 50  # a worker that is still busy when the signal comes
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    run_dir = (tmp_path / "artifacts" / "tiny").resolve()

    # The last pass sends SIGTERM twice (a CI runner or a supervisor often repeats it): the
    # second one comes while the first one's clean-up stops the worker.
    for sig, times in ((signal.SIGKILL, 1), (signal.SIGTERM, 1), (signal.SIGTERM, 2)):
        p = start(tmp_path, "--artifacts", str(tmp_path / "artifacts"))
        wait_for(p, "bench/*.spec.json", run_dir)
        end = time.monotonic() + 60
        while not _workers(run_dir) and time.monotonic() < end and p.poll() is None:
            time.sleep(0.05)
        workers = _workers(run_dir)
        assert workers, "no benchmark worker seen"
        os.kill(p.pid, sig)  # the main process alone
        if times == 2:
            time.sleep(0.05)
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:  # already gone: nothing left to interrupt
                pass
        code, err = finish(p)
        assert _gone(workers, run_dir), f"benchmark worker outlived its run ({sig.name})"
        if sig == signal.SIGTERM:
            assert code == 143, err
            assert "terminated (SIGTERM); run again to resume" in one_line_error(err)
        for stale in run_dir.glob("bench/*.spec.json"):
            stale.unlink()
