"""The plan of a run (compress/run/plan.py): stage order, inputs, and fingerprints that stay
what they were (a cached run stays cached), plus other models a stage names (distill's
`student` folder) entering its fingerprint."""

from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import pytest

from compress import __version__
from compress.data.artifacts import Artifact, digest
from compress.run.plan import build_plan
from compress.recipe.schema import MODEL_ID, load_recipe, validate_recipe
from compress.core.registry import get_stage
from tests.conftest import ROOT, tiny_recipe

SHIPPED = ROOT / "recipes" / "bert_sentiment.yaml"


def _old_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def old_stage_fingerprint(recipe, sid, artifacts, train_fp):
    """compress.run.runner.stage_fingerprint as it was before the plan (commit 63870b6), verbatim."""
    spec = recipe.stage(sid)
    kind = get_stage(spec.uses)
    return digest({
        "kind": kind.name,
        "config": spec.config.model_dump(mode="json"),
        "input": artifacts[spec.source].identity,
        "refs": {k: artifacts[v].identity for k, v in spec.config.refs().items()},
        "budget": {k: getattr(recipe.budget, k) for k in kind.budget_keys},
        "data": train_fp,
        "versions": {"compress": __version__, "torch": _old_version("torch"),
                     "transformers": _old_version("transformers")},
    })


def old_topo_order(recipe):
    """compress.run.runner.topo_order before the plan, verbatim."""
    done = []

    def visit(sid):
        if sid in done or sid == MODEL_ID:
            return
        spec = recipe.stage(sid)
        for dep in [spec.source, *spec.config.refs().values()]:
            visit(dep)
        done.append(sid)

    for s in recipe.stages:
        visit(s.id)
    return done


def _chain(recipe, plan, fingerprint):
    """Fingerprints of every step, each stage's artifact standing in with its fingerprint
    and some written files (so identities are the digest of both, as after a run)."""
    artifacts = {MODEL_ID: Artifact(MODEL_ID, Path("m"), "checkpoint", "model-fp")}
    out = {}
    for sid in plan.order:
        out[sid] = fingerprint(sid, artifacts)
        artifacts[sid] = Artifact(sid, Path(sid), "hf", out[sid], output=f"files-of-{sid}")
    return out


def test_the_shipped_recipe_keeps_its_order_and_every_fingerprint():
    recipe = load_recipe(SHIPPED)
    plan = build_plan(recipe)
    assert plan.order == old_topo_order(recipe)
    assert plan.order[0] == "baseline" and plan.order[-1] == "cascade" and len(plan.order) == len(recipe.stages)
    new = _chain(recipe, plan, lambda sid, arts: plan.fingerprint(plan.step(sid), arts, "train-fp"))
    old = _chain(recipe, plan, lambda sid, arts: old_stage_fingerprint(recipe, sid, arts, "train-fp"))
    assert new == old
    # The check can fail: another input or another data fingerprint is another digest.
    assert len(set(new.values())) == len(new)
    arts = {MODEL_ID: Artifact(MODEL_ID, Path("m"), "checkpoint", "other-model")}
    assert plan.fingerprint(plan.step("baseline"), arts, "train-fp") != new["baseline"]


def test_steps_carry_kind_inputs_refs_and_budget_keys():
    recipe = load_recipe(SHIPPED)
    plan = build_plan(recipe)
    cascade = plan.step("cascade")
    assert cascade.kind.name == "cascade" and cascade.source == "small_ov_int8"
    assert dict(cascade.refs) == {"large": "onnx_int8"} and cascade.inputs == ("small_ov_int8", "onnx_int8")
    assert dict(cascade.budget) == {"max_accuracy_drop": 1.0}
    assert plan.step("baseline").reads_model and not plan.step("int8").reads_model
    assert dict(plan.step("onnx").budget) == {} and not plan.step("student").models
    assert plan.step("int8").config is recipe.stage("int8").config
    with pytest.raises(KeyError):
        plan.step("nope")


def test_order_puts_every_stage_after_what_it_reads(tiny_classifier, tiny_data):
    raw = tiny_recipe(tiny_classifier, tiny_data)
    # Listed before the stages they read: a cascade whose `large` member comes later too.
    raw["stages"] = [
        {"id": "both", "uses": "cascade", "from": "q", "with": {"large": "base"}},
        {"id": "q", "uses": "quantize_dynamic", "from": "base"},
        {"id": "base", "uses": "finetune"},
        {"id": "free", "uses": "quantize_dynamic", "from": "model"},
    ]
    raw["budget"] = {"baseline": "base"}
    plan = build_plan(validate_recipe(raw))
    assert plan.order == ["base", "q", "both", "free"]
    assert plan.order == old_topo_order(validate_recipe(raw))


def _distill_recipe(teacher: Path, data: Path, student: Path | str | None) -> dict:
    raw = tiny_recipe(teacher, data)
    raw["data"]["max_train_examples"] = 64
    settings = {"epochs": 1, "lr": 1e-3, "batch_size": 32, "max_length": 16}
    if student is not None:
        settings["student"] = str(student)
    raw["stages"] = [{"id": "small", "uses": "distill", "with": settings}]
    raw["budget"] = {"baseline": "model", "max_accuracy_drop": 100}
    return raw


def test_a_stage_without_other_models_keeps_its_old_fingerprint(tiny_classifier_4l, tiny_data):
    recipe = validate_recipe(_distill_recipe(tiny_classifier_4l, tiny_data, None))
    plan = build_plan(recipe)
    new = _chain(recipe, plan, lambda sid, arts: plan.fingerprint(plan.step(sid), arts, "d"))
    assert new == _chain(recipe, plan, lambda sid, arts: old_stage_fingerprint(recipe, sid, arts, "d"))


def test_a_student_folder_enters_the_fingerprint(tiny_classifier_4l, tiny_classifier, tiny_data, tmp_path):
    from compress.core.errors import ModelSourceError
    from compress.run.plan import resolve_models
    from compress.data.sources import resolve_model

    student = tmp_path / "student"
    shutil.copytree(tiny_classifier, student)
    recipe = validate_recipe(_distill_recipe(tiny_classifier_4l, tiny_data, student))
    plan = build_plan(recipe)
    step = plan.step("small")
    assert step.models["student"].source == str(student)
    models = resolve_models(step, recipe.base_dir)
    assert models == {"student": resolve_model(recipe.model.model_copy(update={"source": str(student)}),
                                               recipe.base_dir).fingerprint}
    arts = {MODEL_ID: Artifact(MODEL_ID, Path("m"), "hf", "model-fp")}
    before = plan.fingerprint(step, arts, "d", models)
    assert before != old_stage_fingerprint(recipe, "small", arts, "d")
    with pytest.raises(ValueError, match="resolve_models"):
        plan.fingerprint(step, arts, "d")
    config = json.loads((student / "config.json").read_text())
    (student / "config.json").write_text(json.dumps({**config, "classifier_dropout": 0.3}))
    assert plan.fingerprint(step, arts, "d", resolve_models(step, recipe.base_dir)) != before
    shutil.rmtree(student)
    with pytest.raises(ModelSourceError, match=r"^\[small\] distill: with\.student: "):
        resolve_models(step, recipe.base_dir)


def test_an_edited_student_folder_runs_distill_again(tiny_classifier_4l, tiny_classifier, tiny_data, tmp_path,
                                                     monkeypatch):
    """Through the runner: an unchanged student folder is reused, an edited one (a weight,
    then config.json) re-runs the stage. The benchmark is left out: only the stage cache is
    under test."""
    from safetensors.torch import load_file, save_file

    from compress.run import runner
    from compress.recipe.schema import validate_recipe

    monkeypatch.setattr(runner, "_benchmark_and_decide", lambda *a, **k: {"stages": a[5]})
    student = tmp_path / "student"
    shutil.copytree(tiny_classifier, student)
    recipe = validate_recipe(_distill_recipe(tiny_classifier_4l, tiny_data, student))

    def run() -> tuple[list[str], dict]:
        lines: list[str] = []
        report = runner.run_recipe(recipe, tmp_path / "art", log=lines.append, threads=1)
        return [ln for ln in lines if ln.startswith("[small]")], report["stages"]["small"]

    lines, info = run()
    assert any("distill: running (no output yet)" in ln for ln in lines) and info["cached"] is False
    lines, info = run()
    assert any("distill: up to date (reused)" in ln for ln in lines) and info["cached"] is True

    weights = student / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["classifier.bias"] = tensors["classifier.bias"] + 1.0
    save_file(tensors, str(weights), metadata={"format": "pt"})
    lines, info = run()
    assert any("distill: running (inputs or settings changed)" in ln for ln in lines), lines
    assert info["cached"] is False
    assert any("up to date" in ln for ln in run()[0])

    config = json.loads((student / "config.json").read_text())
    (student / "config.json").write_text(json.dumps({**config, "classifier_dropout": 0.3}))
    lines, info = run()
    assert any("distill: running (inputs or settings changed)" in ln for ln in lines), lines


def test_the_cache_policy_of_force_and_no_rebuild(tiny_classifier, tiny_data, tmp_path):
    from compress.data.artifacts import ArtifactStore
    from compress.core.errors import ArtifactError
    from compress.run.runner import CachePolicy

    raw = tiny_recipe(tiny_classifier, tiny_data)
    raw["stages"] = [{"id": "int8", "uses": "quantize_dynamic"}]
    raw["budget"] = {"baseline": "model"}
    step = build_plan(validate_recipe(raw)).step("int8")
    store = ArtifactStore(tmp_path)
    tmp = store.begin("int8")
    (tmp / "w.bin").write_bytes(b"weights")
    store.commit("int8", tmp, "fp1", "torch_int8")

    assert CachePolicy().lookup(store, step, "fp1")[0].fingerprint == "fp1"
    assert CachePolicy().lookup(store, step, "fp2") == (None, "inputs or settings changed")
    assert CachePolicy(frozenset({"int8"})).lookup(store, step, "fp1") == (None, "forced")
    assert CachePolicy(rebuild=False).lookup(store, step, "fp1")[0] is not None
    with pytest.raises(ArtifactError) as err:
        CachePolicy(frozenset({"int8"}), rebuild=False).lookup(store, step, "fp1")
    assert str(err.value) == ("[int8] quantize_dynamic: forced; --no-rebuild forbids running it "
                              "(run without --no-rebuild to rebuild it)")
    with pytest.raises(ArtifactError, match=r"^\[int8\] quantize_dynamic: inputs or settings changed; --no-rebuild"):
        CachePolicy(rebuild=False).lookup(store, step, "fp2")
