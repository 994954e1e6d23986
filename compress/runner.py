"""Runs a validated recipe: stages in dependency order (reusing every output whose
fingerprint is unchanged), then the benchmark, the decision and the reports.

The runner knows stages only through the registry: a new stage kind plugs in without a
change here.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Callable

from compress import __version__
from compress.artifacts import RESULT, Artifact, ArtifactStore, RunLock, digest
from compress.console import heartbeat, quiet_libraries, stamped
from compress.console import log as default_log
from compress.errors import ArtifactError, StageError
from compress.recipe import MODEL_ID, Recipe
from compress.registry import get_stage


def topo_order(recipe: Recipe) -> list[str]:
    """Stage ids, each after everything it reads (recipe order where free)."""
    done: list[str] = []

    def visit(sid: str) -> None:
        if sid in done or sid == MODEL_ID:
            return
        spec = recipe.stage(sid)
        for dep in [spec.source, *spec.config.refs().values()]:
            visit(dep)
        done.append(sid)

    for s in recipe.stages:
        visit(s.id)
    return done


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def stage_fingerprint(recipe: Recipe, sid: str, artifacts: dict[str, Artifact], train_fp: str) -> str:
    spec = recipe.stage(sid)
    kind = get_stage(spec.uses)
    return digest({
        "kind": kind.name,
        "config": spec.config.model_dump(mode="json"),
        "input": artifacts[spec.source].identity,
        "refs": {k: artifacts[v].identity for k, v in spec.config.refs().items()},
        "budget": {k: getattr(recipe.budget, k) for k in kind.budget_keys},
        "data": train_fp,
        "versions": {"compress": __version__, "torch": _version("torch"), "transformers": _version("transformers")},
    })


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
    stages and only the main one writes (see compress/distributed.py); the others
    return None once the stages are done.
    """
    from contextlib import nullcontext

    from compress.data import Data
    from compress.distributed import Processes
    from compress.formats import write_labels
    from compress.sources import check_model_folder, first_nonfinite, never_prompt, resolve_model

    quiet_libraries()  # library chatter drowns the run's own lines; COMPRESS_DEBUG=1 keeps it
    never_prompt()
    log = stamped(log)  # the heartbeat stays quiet while lines are logged
    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()
    run_dir = artifacts_root / recipe.name
    procs = Processes()
    if not procs.is_main:
        log = _quiet()
    with RunLock(run_dir) if procs.is_main else nullcontext():
        store = ArtifactStore(run_dir)
        if procs.is_main:
            store.sweep()  # temporary folders of an interrupted run are never trusted
        model = resolve_model(recipe.model, recipe.base_dir)
        log(f"model: {recipe.model.source} ({model.format}, {model.origin})")
        head = _check_model_against_recipe(recipe, model)
        data = Data(recipe.data, recipe.base_dir, head=head)
        data_notes = [_unk_note(recipe, model.path, data)]
        log(f"data: {len(data.train)} training / {len(data.eval)} eval examples, {data.num_labels} labels "
            f"({data.sources['eval']})")
        for note in data.notes:
            log(f"data: note: {note}")
        artifacts: dict[str, Artifact] = {MODEL_ID: Artifact(MODEL_ID, model.path, model.format, model.fingerprint)}

        threads = threads or recipe.benchmark.threads
        device = procs.device or _train_device()
        procs.share()  # the others start once the main process holds the lock and has swept
        stages_info: dict[str, dict] = {}
        model_checked = False
        for sid in topo_order(recipe):
            spec = recipe.stage(sid)
            kind = get_stage(spec.uses)
            fp = stage_fingerprint(recipe, sid, artifacts, data.train_fingerprint)
            cached = None if sid in force or not procs.is_main else store.load(sid, fp)
            _, why = (None, "") if cached is not None or not procs.is_main else store.check(sid, fp)
            if procs.is_main and cached is None and not rebuild:
                raise ArtifactError(
                    f"[{sid}] {kind.name}: {'forced' if sid in force else why}; --no-rebuild forbids running "
                    f"it (run without --no-rebuild to rebuild it)"
                )
            if procs.share(cached is not None):
                cached = cached or _committed(store, sid, fp)
                log(f"[{sid}] {kind.name}: up to date (reused)")
                artifacts[sid] = cached
                stages_info[sid] = {"uses": kind.name, "cached": True, "seconds": cached.result.get("seconds")}
                continue
            log(f"[{sid}] {kind.name}: running ({'forced' if sid in force else why})")
            if not model_checked and MODEL_ID in (spec.source, *spec.config.refs().values()):
                # Before the first stage that loads it: a broken model is a one-line error.
                check_model_folder(model.path, recipe.model.trust_remote_code)
                model_checked = True
            tmp = store.begin(sid)
            try:
                ctx = _context(recipe, sid, artifacts, tmp, data, log, device, threads)
                if not procs.is_main:  # derived data too stays with the main process
                    ctx.cache_root = tmp / ".cache"
                t0 = time.perf_counter()
                with heartbeat(f"[{sid}] {kind.name}", log):
                    result = kind.run(ctx)
                seconds = time.perf_counter() - t0
                bad = first_nonfinite(tmp)
                if bad:  # diverged training (a huge lr) or a NaN input: never committed
                    raise StageError(f"[{sid}] {kind.name}: its output has NaN or infinite weights ({bad}); not kept: "
                                     f"lower the learning rate, or check the model it started from")
                if not isinstance(result, kind.result) or result.format != kind.produces:
                    raise StageError(f"{sid}: stage {kind.name} returned {type(result).__name__}, not its result type")
                _test_pause(sid)
                if procs.is_main:
                    if data.id2label:  # every variant's config.json names the classes (pipelines answer names)
                        write_labels(tmp, data.id2label)
                    payload = result.model_dump(mode="json")
                    payload["seconds"] = round(seconds, 2)
                    (tmp / RESULT).write_text(_json(payload))
                    artifacts[sid] = store.commit(sid, tmp, fp, kind.produces, {"stage": kind.name})
            except BaseException:
                store.discard(tmp)
                raise
            if not procs.is_main:
                store.discard(tmp)
            procs.share()  # the others wait for the commit, then read what was committed
            if not procs.is_main:
                artifacts[sid] = _committed(store, sid, fp)
            log(f"[{sid}] done in {seconds:.1f}s")
            stages_info[sid] = {"uses": kind.name, "cached": False, "seconds": round(seconds, 2)}

        procs.close()  # no collective call after the stages: the benchmark is the main process's
        if not procs.is_main:
            return None
        if not model_checked and recipe.budget.baseline == MODEL_ID:
            check_model_folder(model.path, recipe.model.trust_remote_code)  # benchmarked as it is
        report = _benchmark_and_decide(recipe, artifacts, data, model, run_dir, stages_info, log, started, t_start, threads,
                                       data_notes)
    return report



def _check_model_against_recipe(recipe: Recipe, model) -> list[str] | None:
    """What validation checks when the model's files are at hand, for a model only now
    downloaded: the length settings fit its positions (exit 2 rather than a tensor-size
    crash mid-run), and the stages take its tokenizer. Returns the id2label names of a head used as it is, for Data to match."""
    import json

    from compress.recipe import check_lengths, check_tokenizer, head_used_as_is
    from compress.sources import head_labels

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
    from compress.data import unk_share

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
    from compress import console

    console.out.quiet = console.err.quiet = True
    return lambda message: None


def _test_pause(sid: str) -> None:
    """Test hook: COMPRESS_TEST_PAUSE_IN=<stage id> holds the run after that stage wrote its
    output but before the output is committed, so crash tests can kill it there."""
    import os

    if os.environ.get("COMPRESS_TEST_PAUSE_IN") == sid:
        default_log(f"[{sid}] paused before commit (COMPRESS_TEST_PAUSE_IN)")
        time.sleep(float(os.environ.get("COMPRESS_TEST_PAUSE_SECONDS", "600")))


def _context(recipe, sid, artifacts, out, data, log, device, threads):
    from compress.context import StageContext

    spec = recipe.stage(sid)
    return StageContext(
        stage_id=sid, config=spec.config, input=artifacts[spec.source], out=out, recipe=recipe,
        refs={k: artifacts[v] for k, v in spec.config.refs().items()}, _data=lambda: data, log=log,
        device=device, threads=threads, seed=recipe.data.seed,
    )


def _train_device() -> str:
    from compress.benchmark import cuda_available

    return "cuda" if cuda_available() else "cpu"


def _json(obj) -> str:
    import json

    return json.dumps(obj, indent=1, default=str)


def _benchmark_and_decide(*args, **kwargs) -> dict:
    """The benchmark, the decision and the reports (compress/evaluate.py); report.json's object."""
    from compress.evaluate import benchmark_and_decide

    return benchmark_and_decide(*args, **kwargs)
