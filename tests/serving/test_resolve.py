"""compress.serving.server's checks before Ray starts: which variant folder, its fingerprint,
the run's serving block; each refusal one line that says what to do."""

import json

import pytest

from compress.core.errors import CompressError
from compress.data.artifacts import ArtifactStore
from compress.serving.server import resolve, run_serving_spec


def commit(run, name, fmt="hf", fingerprint="fp"):
    store = ArtifactStore(run)
    tmp = store.begin(name)
    (tmp / "config.json").write_text("{}")
    store.commit(name, tmp, fingerprint, fmt)
    store.sweep()


def refusal(run, variant=None) -> str:
    with pytest.raises(CompressError) as exc:
        resolve(run, variant)
    assert len(str(exc.value).splitlines()) == 1
    return str(exc.value)


def test_the_selected_variant_or_the_one_named(tmp_path):
    run = tmp_path / "run"
    commit(run, "a", fingerprint="fp-a")
    commit(run, "b")
    (run / "report.json").write_text(json.dumps({"schema_version": 6, "decision": {"selected": "a"}, "rows": []}))
    vid, folder, fmt, fp = resolve(run, None)
    assert (vid, folder, fmt) == ("a", run / "a", "hf") and fp == ArtifactStore(run).load("a").identity != "fp-a"
    assert resolve(run, "b")[0] == "b"


def test_refusals_say_what_to_do(tmp_path):
    assert "no such run folder" in refusal(tmp_path / "nope")
    run = tmp_path / "run"
    run.mkdir()
    assert "no report.json" in refusal(run) and "--variant" in refusal(run)
    (run / "report.json").write_text(json.dumps({"schema_version": 6, "decision": {"selected": None}, "rows": []}))
    assert "selected no variant" in refusal(run)
    (run / "report.json").write_text("{broken")
    assert "not a readable compress report" in refusal(run)
    commit(run, "a")
    commit(run, "lm", fmt="genai")
    assert "no variant 'x'" in refusal(run, "x") and "known: a, lm" in refusal(run, "x")
    assert "no variant" in refusal(run, "../run") and "no variant" in refusal(run, ".tmp")
    assert "not a classifier variant" in refusal(run, "lm")
    (run / "a" / "config.json").write_text('{"edited": 1}')
    assert "not a finished variant" in refusal(run, "a") and "re-run" in refusal(run, "a")


def test_the_runs_serving_block_from_its_manifest(tmp_path):
    assert run_serving_spec(tmp_path).server.max_batch_size >= 1  # no manifest: the defaults
    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": {"serving": {"server": {"max_batch_size": 3}}}}))
    assert run_serving_spec(tmp_path).server.max_batch_size == 3
    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": {"serving": {"server": {"max_batch_size": 0}}}}))
    with pytest.raises(CompressError, match="serving.server.max_batch_size"):
        run_serving_spec(tmp_path)


def test_a_resolved_recipe_with_autoscaling_reads_back(tmp_path):
    from compress.recipe.serving import ServingSpec

    spec = ServingSpec.model_validate({"server": {"autoscaling": {"max_replicas": 2}}})
    (tmp_path / "manifest.json").write_text(json.dumps({"recipe": {"serving": spec.model_dump(mode="json")}}))
    assert run_serving_spec(tmp_path).server.autoscaling.max_replicas == 2
