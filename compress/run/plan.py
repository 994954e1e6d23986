"""The plan of a run, built once from a validated recipe: its stages in dependency order,
each with its kind, settings, inputs and the budget keys it reads, and the fingerprint
that decides whether a finished output can be reused.

A stage's fingerprint covers everything its output depends on: its kind and settings,
the identity of its `from` input and of the stages it refers to (their fingerprints and
written files, see Artifact.identity), the files of any other model its settings name
(distill's `student`, see StageConfig.sources), the budget keys it reads, the training
data, and the versions of compress, torch and transformers. A stage whose fingerprint is
unchanged is reused; any change re-runs it and, through its identity, everything after it.

Nothing here runs a stage or loads a model: the runner executes the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from compress import __version__
from compress.data.artifacts import Artifact, digest
from compress.core.errors import ModelSourceError
from compress.recipe.schema import MODEL_ID, Recipe
from compress.core.registry import ModelSource, StageConfig, StageKind, get_stage


@dataclass(frozen=True)
class Step:
    """One stage of the plan."""

    id: str
    kind: StageKind
    config: StageConfig
    source: str  # the `from` input: a stage id, or MODEL_ID for the recipe's model
    refs: Mapping[str, str]  # config key -> id of another stage it reads (StageConfig.refs)
    budget: Mapping[str, Any]  # the values of the budget keys the kind reads (StageKind.budget_keys)
    models: Mapping[str, ModelSource]  # config key -> another model it reads (StageConfig.sources)

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every stage id (or MODEL_ID) this step reads: its `from` input, then its refs."""
        return (self.source, *self.refs.values())

    @property
    def reads_model(self) -> bool:
        return MODEL_ID in self.inputs

    def describe(self) -> str:
        """How log lines and errors name the step: `[id] kind`."""
        return f"[{self.id}] {self.kind.name}"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]  # dependency order: each after everything it reads
    # compress, torch and transformers versions: a new version may write other outputs.
    versions: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def order(self) -> list[str]:
        return [s.id for s in self.steps]

    def step(self, sid: str) -> Step:
        for s in self.steps:
            if s.id == sid:
                return s
        raise KeyError(sid)

    def fingerprint(self, step: Step, artifacts: Mapping[str, Artifact], train_fp: str,
                    models: Mapping[str, str] | None = None) -> str:
        """The step's fingerprint once its inputs exist. `models`: the content fingerprint of
        each model in step.models (see resolve_models)."""
        record = {
            "kind": step.kind.name,
            "config": step.config.model_dump(mode="json"),
            "input": artifacts[step.source].identity,
            "refs": {k: artifacts[v].identity for k, v in step.refs.items()},
            "budget": dict(step.budget),
            "data": train_fp,
            "versions": dict(self.versions),
        }
        if step.models:  # only then: every other stage keeps the fingerprint it always had
            missing = set(step.models) - set(models or {})
            if missing:
                raise ValueError(f"{step.id}: no fingerprint for {sorted(missing)}; resolve_models first")
            record["models"] = {k: models[k] for k in sorted(step.models)}
        return digest(record)


def build_plan(recipe: Recipe, kinds: Callable[[str], StageKind] = get_stage) -> Plan:
    """The plan of a validated recipe: stages after everything they read (recipe order where
    free). `kinds` looks a stage kind up by name (the registry's)."""
    order: list[str] = []

    def visit(sid: str) -> None:
        if sid in order or sid == MODEL_ID:
            return
        spec = recipe.stage(sid)
        for dep in [spec.source, *spec.config.refs().values()]:
            visit(dep)
        order.append(sid)

    for s in recipe.stages:
        visit(s.id)
    steps = []
    for sid in order:
        spec = recipe.stage(sid)
        kind = kinds(spec.uses)
        steps.append(Step(
            id=sid, kind=kind, config=spec.config, source=spec.source, refs=dict(spec.config.refs()),
            budget={k: getattr(recipe.budget, k) for k in kind.budget_keys}, models=dict(spec.config.sources()),
        ))
    versions = {"compress": __version__, "torch": _version("torch"), "transformers": _version("transformers")}
    return Plan(tuple(steps), versions)


def resolve_models(step: Step, base_dir: Path) -> dict[str, str]:
    """{config key: content fingerprint} of the other models a step names, found as the
    recipe's model is (a folder relative to the recipe, the hub cache, a download when
    online, a package): the same fingerprint over weights and JSON files."""
    from compress.recipe.schema import ModelSpec
    from compress.data.sources import resolve_model

    out = {}
    for key, model in step.models.items():
        try:
            out[key] = resolve_model(ModelSpec(source=model.source, revision=model.revision), base_dir).fingerprint
        except ModelSourceError as exc:  # its message names model.source: say which setting it is
            raise ModelSourceError(f"{step.describe()}: with.{key}: {str(exc).removeprefix('model.source: ')}") from exc
    return out


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
