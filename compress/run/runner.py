"""Runs a validated recipe: stages in dependency order (reusing every output whose
fingerprint is unchanged), then the benchmark, the decision and the reports.

The plan (compress/run/plan.py) is built once from the recipe; the executor here runs it. Who
writes is decided once too: a role object (`_Leader` for the only process or the main one
under `accelerate launch`, `_Follower` for the others, see compress/bench/distributed.py) answers
every question the loop has about locking, the cache and committing. The runner knows
stages only through the registry: a new stage kind plugs in without a change here.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from compress.data.artifacts import RESULT, Artifact, ArtifactStore, RunLock
from compress.core.console import heartbeat, quiet_libraries, stamped
from compress.core.console import log as default_log
from compress.core.errors import ArtifactError, StageError
from compress.core.files import write_file
from compress.run.plan import Plan, Step, build_plan, resolve_models
from compress.recipe.schema import MODEL_ID, Recipe, causal_format
from compress.core.registry import StageResult, get_stage  # looked up here at run time (tests swap a kind in)

if TYPE_CHECKING:  # pragma: no cover
    from compress.tasks.classification.data import Data
    from compress.bench.distributed import Processes
    from compress.data.sources import ResolvedModel


def run_recipe(
    recipe: Recipe,
    artifacts_root: Path,
    force: tuple[str, ...] = (),
    log: Callable[[str], None] = default_log,
    threads: int | None = None,
    rebuild: bool = True,
) -> dict | None:
    """Runs everything and returns the report (also written to the run folder).

    rebuild=False refuses to run a stage whose output is missing, stale or corrupt (for
    CI that must use what was built). Under `accelerate launch` every process runs the
    stages and only the main one writes (see compress/bench/distributed.py); the others
    return None once the stages are done.
    """
    from compress.tasks.classification.data import Data
    from compress.bench.distributed import Processes
    from compress.data.sources import check_model_folder, never_prompt, resolve_model

    quiet_libraries()  # library chatter drowns the run's own lines; COMPRESS_DEBUG=1 keeps it
    never_prompt()
    log = stamped(log)  # the heartbeat stays quiet while lines are logged
    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()
    run_dir = artifacts_root / recipe.name
    plan = build_plan(recipe, get_stage)
    role = _role(Processes(), CachePolicy(frozenset(force), rebuild))
    log = role.logger(log)
    with role.lock(run_dir):
        store = ArtifactStore(run_dir)
        role.prepare(store)
        model = resolve_model(recipe.model, recipe.base_dir, log=log)
        shown = causal_format(model.format) if recipe.is_causal else model.format
        log(f"model: {recipe.model.source} ({shown}, {model.origin})")
        head = _check_model_against_recipe(recipe, model)
        if recipe.lm is not None:
            from compress.tasks.causal_lm.data import load_lm_evals

            from compress.tasks.causal_lm.task import check_prompt_lengths

            data = load_lm_evals(recipe.lm, recipe.base_dir)
            check_prompt_lengths(data, recipe.lm, model.path, recipe.model.trust_remote_code)
            data_notes = []
            log(f"data: {data.summary()}")
        else:
            data = Data(recipe.data, recipe.base_dir, head=head)
            data_notes = [_unk_note(recipe, model.path, data)]
            log(f"data: {len(data.train)} training / {len(data.eval)} eval examples, {data.num_labels} labels "
                f"({data.sources['eval']})")
        for note in data.notes:
            log(f"data: note: {note}")

        threads = threads or recipe.benchmark.threads
        executor = Executor(plan, recipe, store, role, data, model, log,
                            device=role.procs.device or _train_device(), threads=threads)
        role.barrier()  # the others start once the main process holds the lock and has swept
        executor.run()
        role.procs.close()  # no collective call after the stages: the benchmark is the main process's
        if not role.reports:
            return None
        if not executor.model_checked and recipe.budget.baseline == MODEL_ID:
            check_model_folder(model.path, recipe.model.trust_remote_code)  # benchmarked as it is
        stages_info = {sid: outcome.info() for sid, outcome in executor.outcomes.items()}
        report = _benchmark_and_decide(recipe, executor.artifacts, data, model, run_dir, stages_info, log, started,
                                       t_start, threads, data_notes)
    return report


# ---------------------------------------------------------------------------------------
# The cache policy and the roles of the run's processes


@dataclass(frozen=True)
class CachePolicy:
    """--force and --no-rebuild: which finished outputs may be reused, and whether a stage
    may run at all."""

    force: frozenset[str] = frozenset()
    rebuild: bool = True

    def lookup(self, store: ArtifactStore, step: Step, fp: str) -> tuple[Artifact | None, str]:
        """(the reusable output, '') or (None, why the stage runs)."""
        if step.id in self.force:
            cached, why = None, "forced"
        else:
            cached = store.load(step.id, fp)
            why = "" if cached is not None else store.check(step.id, fp)[1]
        if cached is None and not self.rebuild:
            raise ArtifactError(
                f"{step.describe()}: {why}; --no-rebuild forbids running it (run without --no-rebuild to rebuild it)"
            )
        return cached, why


class _Role:
    """What one process of the run does around each stage. Every process runs every stage
    (training needs all of them) and calls `procs.share` at the same places."""

    reports: bool  # runs the benchmark, the decision and the reports

    def __init__(self, procs: "Processes") -> None:
        self.procs = procs

    def agree(self, reuse: bool) -> bool:
        """The main process's decision to reuse a stage, the same in every process."""
        return bool(self.procs.share(reuse))

    def barrier(self) -> None:
        """Every process waits here for the others (for the main process's commit)."""
        self.procs.share()


class _Leader(_Role):
    """The only process, or the main one of several: holds the run lock, looks in the cache,
    and commits every output."""

    reports = True

    def __init__(self, procs: "Processes", cache: CachePolicy) -> None:
        super().__init__(procs)
        self.cache = cache

    def logger(self, log: Callable[[str], None]) -> Callable[[str], None]:
        return log

    def lock(self, run_dir: Path) -> AbstractContextManager:
        return RunLock(run_dir)

    def prepare(self, store: ArtifactStore) -> None:
        store.sweep()  # temporary folders of an interrupted run are never trusted

    def lookup(self, store: ArtifactStore, step: Step, fp: str) -> tuple[Artifact | None, str]:
        return self.cache.lookup(store, step, fp)

    def reused(self, store: ArtifactStore, step: Step, fp: str, cached: Artifact | None) -> Artifact:
        assert cached is not None
        return cached

    def cache_root(self, tmp: Path) -> Path | None:
        return None  # the run folder's .cache (StageContext.cache_dir)

    def keep(self, store: ArtifactStore, step: Step, fp: str, tmp: Path, result: StageResult, seconds: float,
             id2label: dict[int, str] | None) -> Artifact:
        from compress.formats import write_labels

        if id2label:  # every variant's config.json names the classes (pipelines answer names)
            write_labels(tmp, id2label)
        payload = result.model_dump(mode="json")
        payload["seconds"] = round(seconds, 2)
        write_file(tmp / RESULT, _json(payload))
        return store.commit(step.id, tmp, fp, step.kind.produces, {"stage": step.kind.name})

    def committed(self, store: ArtifactStore, step: Step, fp: str, own: Artifact | None) -> Artifact:
        assert own is not None
        return own


class _Follower(_Role):
    """Another process under `accelerate launch`: prints nothing, writes into throw-away
    folders, and goes on from what the main process committed."""

    reports = False

    def logger(self, log: Callable[[str], None]) -> Callable[[str], None]:
        return _quiet()

    def lock(self, run_dir: Path) -> AbstractContextManager:
        return nullcontext()  # the main process holds it for the run

    def prepare(self, store: ArtifactStore) -> None:
        pass  # sweeping is the main process's (it may already be writing)

    def lookup(self, store: ArtifactStore, step: Step, fp: str) -> tuple[Artifact | None, str]:
        return None, ""  # the main process decides (see agree)

    def reused(self, store: ArtifactStore, step: Step, fp: str, cached: Artifact | None) -> Artifact:
        return _committed(store, step.id, fp)

    def cache_root(self, tmp: Path) -> Path | None:
        return tmp / ".cache"  # derived data too stays with the main process

    def keep(self, store: ArtifactStore, step: Step, fp: str, tmp: Path, result: StageResult, seconds: float,
             id2label: dict[int, str] | None) -> None:
        return None

    def committed(self, store: ArtifactStore, step: Step, fp: str, own: Artifact | None) -> Artifact:
        return _committed(store, step.id, fp)


def _role(procs: "Processes", cache: CachePolicy) -> _Leader | _Follower:
    return _Leader(procs, cache) if procs.is_main else _Follower(procs)


# ---------------------------------------------------------------------------------------
# The executor


@dataclass(frozen=True)
class StageOutcome:
    """How a stage of this run went, for report.json `stages` and `timing`."""

    uses: str
    cached: bool
    seconds: float | None  # a reused stage: the time it took when it ran

    def info(self) -> dict:
        return {"uses": self.uses, "cached": self.cached, "seconds": self.seconds}


@dataclass
class Executor:
    """Runs a plan's stages in order, reusing what the cache policy allows."""

    plan: Plan
    recipe: Recipe
    store: ArtifactStore
    role: _Leader | _Follower
    data: "Data"
    model: "ResolvedModel"
    log: Callable[[str], None]
    device: str
    threads: int
    # Called with the stage id once its output is written and checked, before the commit.
    before_commit: Callable[[str], None] = field(default=lambda sid: _test_pause(sid))
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)
    model_checked: bool = False

    def run(self) -> dict[str, Artifact]:
        m = self.model
        fmt = causal_format(m.format) if self.recipe.is_causal else m.format
        self.artifacts[MODEL_ID] = Artifact(MODEL_ID, m.path, fmt, m.fingerprint)
        for step in self.plan.steps:
            models = resolve_models(step, self.recipe.base_dir) if step.models else None
            fp = self.plan.fingerprint(step, self.artifacts, self.data.train_fingerprint, models)
            cached, why = self.role.lookup(self.store, step, fp)
            if self.role.agree(cached is not None):
                art = self.role.reused(self.store, step, fp, cached)
                self.log(f"{step.describe()}: up to date (reused)")
                self.artifacts[step.id] = art
                self.outcomes[step.id] = StageOutcome(step.kind.name, True, art.result.get("seconds"))
                continue
            self.log(f"{step.describe()}: running ({why})")
            if step.reads_model:
                self.check_model()  # before the first stage that loads it: a broken model is a one-line error
            self.artifacts[step.id], seconds = self._run_step(step, fp)
            self.log(f"[{step.id}] done in {seconds:.1f}s")
            self.outcomes[step.id] = StageOutcome(step.kind.name, False, round(seconds, 2))
        return self.artifacts

    def check_model(self) -> None:
        from compress.data.sources import check_model_folder

        if not self.model_checked:
            check_model_folder(self.model.path, self.recipe.model.trust_remote_code)
            self.model_checked = True

    def _run_step(self, step: Step, fp: str) -> tuple[Artifact, float]:
        from compress.data.sources import first_nonfinite

        tmp = self.store.begin(step.id)
        try:
            ctx = self._context(step, tmp)
            t0 = time.perf_counter()
            with heartbeat(step.describe(), self.log):
                result = step.kind.run(ctx)
            seconds = time.perf_counter() - t0
            bad = first_nonfinite(tmp)
            if bad:  # diverged training (a huge lr) or a NaN input: never committed
                raise StageError(f"{step.describe()}: its output has NaN or infinite weights ({bad}); not kept: "
                                 f"lower the learning rate, or check the model it started from")
            if not isinstance(result, step.kind.result) or result.format != step.kind.produces:
                raise StageError(f"{step.id}: stage {step.kind.name} returned {type(result).__name__}, "
                                 f"not its result type")
            self.before_commit(step.id)
            own = self.role.keep(self.store, step, fp, tmp, result, seconds, self.data.id2label)
        except BaseException:
            self.store.discard(tmp)
            raise
        if own is None:  # not committed by this process: the folder was only for the stage to write into
            self.store.discard(tmp)
        self.role.barrier()  # the others wait for the commit, then read what was committed
        return self.role.committed(self.store, step, fp, own), seconds

    def _context(self, step: Step, out: Path):
        from compress.data.context import StageContext

        return StageContext(
            stage_id=step.id, config=step.config, input=self.artifacts[step.source], out=out, recipe=self.recipe,
            refs={k: self.artifacts[v] for k, v in step.refs.items()}, _data=lambda: self.data, log=self.log,
            device=self.device, threads=self.threads, seed=self.recipe.seed, cache_root=self.role.cache_root(out),
        )


def _check_model_against_recipe(recipe: Recipe, model) -> list[str] | None:
    """What validation checks when the model's files are at hand, for a model only now
    downloaded: the length settings fit its positions (exit 2 rather than a tensor-size
    crash mid-run), and the stages take its tokenizer. Returns the id2label names of a head used as it is, for Data to match."""
    import json

    from compress.recipe.schema import check_lengths, check_tokenizer, head_used_as_is
    from compress.recipe.peek import head_labels

    try:
        config = json.loads((model.path / "config.json").read_text())
    except (OSError, ValueError):
        return None  # check_model_folder names the problem before a stage loads it
    if not isinstance(config, dict):
        return None
    where = str(recipe.path) if recipe.path else "<recipe>"
    check_lengths(recipe, config, where)
    try:  # a tokenizer kind a stage cannot take (trim_vocab): said before the baseline trains
        tokenizer = json.loads((model.path / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tokenizer = None
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("model"), dict):
        check_tokenizer(recipe, tokenizer, where)
    return head_labels(config) if model.format == "hf" and head_used_as_is(recipe) else None


def _unk_note(recipe: Recipe, model_path: Path, data) -> str:
    """The share of the eval split's tokens that the model's tokenizer cannot read: text
    every variant is blind to, whatever the compression (a wrong encoding, an alphabet the
    vocabulary lacks)."""
    from compress.tasks.classification.data import unk_share

    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=recipe.model.trust_remote_code)
        share, total = unk_share(tok, data.eval)
    except Exception as exc:  # a broken folder is named by check_model_folder, not here
        return f"data: the share of unknown tokens in the eval split was not measured ({exc.__class__.__name__})"
    data.eval_unk_share = share
    if share is None:
        return f"data: the model's tokenizer has no unknown token; no eval text is unreadable to it ({total} tokens)"
    note = f"data: {share:.2%} of the eval split's {total} tokens are {tok.unk_token} under the model's tokenizer"
    if share > 0.01:
        note += "; every variant is blind to that text: check the file's encoding, or use a model whose vocabulary covers it"
    return note



def _committed(store: ArtifactStore, sid: str, fp: str) -> Artifact:
    """The main process's committed output, read by another process of the run."""
    art = store.load(sid, fp)
    if art is None:
        raise ArtifactError(
            f"{store.folder(sid)}: this process cannot see the output the main process committed; "
            f"under a multi-machine launch --artifacts must be on a file system every machine shares"
        )
    return art


def _quiet() -> Callable[[str], None]:
    """Processes other than the main one print nothing (logs, progress, tables)."""
    from compress.core import console

    console.out.quiet = console.err.quiet = True
    return lambda message: None


def _test_pause(sid: str) -> None:
    """Test hook: COMPRESS_TEST_PAUSE_IN=<stage id> holds the run after that stage wrote its
    output but before the output is committed, so crash tests can kill it there."""
    import os

    if os.environ.get("COMPRESS_TEST_PAUSE_IN") == sid:
        default_log(f"[{sid}] paused before commit (COMPRESS_TEST_PAUSE_IN)")
        time.sleep(float(os.environ.get("COMPRESS_TEST_PAUSE_SECONDS", "600")))


def _train_device() -> str:
    from compress.bench.benchmark import cuda_available

    return "cuda" if cuda_available() else "cpu"


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=1, default=str)


def _benchmark_and_decide(*args, **kwargs) -> dict:
    """The benchmark, the decision and the reports (compress/run/evaluate.py); report.json's object."""
    from compress.run.evaluate import benchmark_and_decide

    return benchmark_and_decide(*args, **kwargs)
