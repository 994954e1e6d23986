"""A variant folder of a finished run behind Ray Serve: the Python API of `compress serve`.

    from compress.serving.server import start
    server = start(run_dir, spec)                 # spec: compress.recipe.serving.ServingSpec
    server.url, server.variant, server.fingerprint  # "http://127.0.0.1:PORT", the variant id, its fingerprint
    server.snapshot()                              # ServerStats: requests by status, batch sizes, cache, routed share
    server.set_batching(max_batch_size=1)          # at runtime, no replica restarted
    server.stop()                                  # drains, then stops Serve (and Ray, when start() started it)

`start(run_dir, spec, variant=None, port=0, address=None) -> Server`: `variant` None serves the
run's selected one (report.json's decision.selected); `port` 0 picks a free port; `address`
joins a Ray cluster instead of starting a local Ray; `port` is the one place the port comes
from (spec.server.port is the command's default). Call it with different ServingSpec copies
one after another in one process (stop each first). To keep one local Ray across several
servers (Ray takes seconds to start), wrap them in `with ray_session(): ...`: start() then
reuses that Ray and stop() leaves it running. ServerStats counts since start(): take one
snapshot before a measurement and one after, and subtract.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from compress.core.errors import CompressError
from compress.data.artifacts import MARKER, ArtifactStore
from compress.recipe.serving import ServingSpec
from compress.serving.stats import FLUSH_S, ServerStats

INSTALL = 'pip install -e ".[serve]"'
# Variant formats a model replica can load as a classifier (compress.formats.LOADERS).
SERVABLE = ("hf", "torch_int8", "onnx", "openvino", "bnb_4bit", "cascade")


def _need_ray():
    try:
        import ray
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise CompressError(f"serving needs Ray Serve, which is not installed: {INSTALL}") from exc
    return ray


class _Decision(BaseModel):
    model_config = ConfigDict(extra="ignore")
    selected: str | None = None


class _Selected(BaseModel):
    """The one thing the server reads of report.json (the reports layer sits above this one)."""

    model_config = ConfigDict(extra="ignore")
    decision: _Decision


def selected_variant(run_dir: Path) -> str:
    path = run_dir / "report.json"
    try:
        rep = _Selected.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise CompressError(f"{path}: no report.json, so no selected variant; run `compress run` first or give "
                            f"--variant ID") from None
    except (OSError, ValueError, ValidationError, RecursionError) as exc:
        raise CompressError(f"{path}: not a readable compress report ({type(exc).__name__}); give --variant ID") from exc
    if rep.decision.selected is None:
        raise CompressError(f"{path}: the run selected no variant (none met the budget); give --variant ID to "
                            f"serve one anyway")
    return rep.decision.selected


def variants(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if (p / MARKER).is_file()) if run_dir.is_dir() else []


def resolve(run_dir: Path, variant: str | None) -> tuple[str, Path, str, str]:
    """(variant id, folder, format, fingerprint) of the variant to serve, checked before Ray starts."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CompressError(f"{run_dir}: no such run folder; give artifacts/NAME of a finished `compress run`")
    variant = variant or selected_variant(run_dir)
    known = variants(run_dir)
    if not variant or variant.startswith(".") or "/" in variant or "\\" in variant or not (run_dir / variant).is_dir():
        raise CompressError(f"--variant: no variant '{variant[:80]}' in {run_dir} (known: {', '.join(known) or 'none'})")
    store = ArtifactStore(run_dir)
    art = store.load(variant)
    if art is None:
        _, why = store.check(variant)
        raise CompressError(f"{run_dir / variant}: not a finished variant ({why}); re-run `compress run` to rebuild it")
    if art.format not in SERVABLE:
        raise CompressError(f"{run_dir / variant}: a {art.format} folder is not a classifier variant; serve one of "
                            f"{', '.join(v for v in known if v != variant) or 'the others'}")
    return variant, art.path, art.format, art.identity


class _Recipe(BaseModel):
    model_config = ConfigDict(extra="ignore")
    serving: dict | None = None


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    recipe: _Recipe = _Recipe()


def run_serving_spec(run_dir: Path) -> ServingSpec:
    """The `serving:` block of the recipe the run was made with (manifest.json), or the defaults."""
    path = Path(run_dir) / "manifest.json"
    try:
        raw = _Manifest.model_validate(json.loads(path.read_text(encoding="utf-8"))).recipe.serving
    except FileNotFoundError:
        return ServingSpec()
    except (OSError, ValueError, ValidationError, RecursionError) as exc:
        raise CompressError(f"{path}: unreadable ({type(exc).__name__}); re-run `compress run`, or give --recipe") from exc
    raw = dict(raw or {})
    server = raw.get("server")
    if isinstance(server, dict) and server.get("autoscaling") is not None:  # the resolved recipe
        raw["server"] = {k: v for k, v in server.items() if k != "num_replicas"}  # fills in num_replicas too
    try:
        return ServingSpec.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"])
        raise CompressError(f"{path}: serving.{where}: {e['msg'].removeprefix('Value error, ')}; fix the recipe and "
                            f"give it with --recipe") from exc


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host if host != "0.0.0.0" else "127.0.0.1", 0))
        return s.getsockname()[1]


def _check_port(host: str, port: int) -> None:
    """A port another program holds is an error now, not a proxy that never comes up."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise CompressError(f"serving.server.port: {host}:{port} is not free ({exc.strerror}); give --port 0 "
                                f"for a free one, or another port") from None


def _init_local_ray(ray) -> None:
    """A small local Ray: no dashboard, no log streaming to this terminal, the machine's CPUs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             object_store_memory=128 << 20, namespace="compress-serve")


@contextlib.contextmanager
def ray_session(address: str | None = None):
    """One Ray for several start()/stop() in a row; shut down on the way out."""
    ray = _need_ray()
    if not ray.is_initialized():
        _init_local_ray(ray) if address is None else ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class Server:
    """A running served variant. stop() is idempotent."""

    def __init__(self, url: str, variant: str, fingerprint: str, app: str, board, owns_ray: bool, shared: bool,
                 drain_timeout_s: float, batching):
        self.url, self.variant, self.fingerprint = url, variant, fingerprint
        self._app, self._board, self._owns_ray, self._shared = app, board, owns_ray, shared
        self._drain_timeout_s = drain_timeout_s
        self._batching = batching
        self._max_ongoing = 100_000  # the model replicas' max_ongoing_requests, set by start()
        self.stopped = False

    def snapshot(self) -> ServerStats:
        """The figures so far, summed over replicas (after one flush interval, so complete)."""
        import ray

        time.sleep(2 * FLUSH_S)
        stats: ServerStats = ray.get(self._board.total.remote(), timeout=30)
        if not stats.replicas:  # before a model replica registered: Serve's own count
            stats.replicas = _running_replicas(self._app)
        return stats

    def set_batching(self, max_batch_size: int | None = None, batch_wait_timeout_s: float | None = None) -> None:
        """Changes the batching of the running server: every replica applies it within a flush
        interval (its @serve.batch queue's set_max_batch_size and set_batch_wait_timeout_s), no
        replica restarts; this returns once they have had the time to."""
        import ray

        from compress.recipe.serving import ServerSpec
        from compress.serving.stats import Batching

        size = self._batching.max_batch_size if max_batch_size is None else max_batch_size
        wait = self._batching.batch_wait_timeout_s if batch_wait_timeout_s is None else batch_wait_timeout_s
        try:  # the recipe's own bounds, and batches that can fill on this server
            ServerSpec(max_batch_size=size, batch_wait_timeout_s=wait, max_ongoing_requests=self._max_ongoing)
        except ValidationError as exc:
            raise CompressError(f"set_batching: {exc.errors()[0]['msg']}") from exc
        self._batching = Batching(max_batch_size=size, batch_wait_timeout_s=wait)
        ray.get(self._board.set_batching.remote(self._batching), timeout=30)
        time.sleep(3 * FLUSH_S)

    def stop(self) -> None:
        """Drains requests in flight (each replica waits for its ongoing requests, at most
        drain_timeout_s), then stops the app, Serve unless it is a cluster's, and Ray if start() began it."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self._drain()
        finally:
            _teardown(self._app, self._board, self._owns_ray, self._shared)

    def _drain(self) -> None:
        """The fronts refuse new predictions (503) and answer the ones they hold; this waits
        until none is in flight. Serve's own graceful stop comes after, when nothing is left
        for it to cut off (deleting the app at once would stop the model replicas while a
        front still had texts queued for them)."""
        import ray

        with contextlib.suppress(Exception):
            ray.get(self._board.drain.remote(), timeout=10)
            # The fronts hear of it at their next flush; a request that came in before that
            # is counted in flight by the flush after it.
            time.sleep(3 * FLUSH_S)
            deadline = time.monotonic() + self._drain_timeout_s
            while time.monotonic() < deadline and ray.get(self._board.total.remote(), timeout=10).in_flight > 0:
                time.sleep(FLUSH_S / 2)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _running_replicas(app: str) -> int:
    from ray import serve

    try:
        deps = serve.status().applications[app].deployments
        dep = deps["Model"] if "Model" in deps else deps["Replica"]
        return int(dep.replica_states.get("RUNNING", 0))
    except Exception:
        return 0


def _teardown(app: str | None, board, owns_ray: bool, shared: bool) -> None:
    import ray
    from ray import serve

    try:
        if ray.is_initialized():
            # Graceful either way: replicas finish their ongoing requests first. Serve of our own
            # goes down whole (app and proxy together, so the proxy never answers 404 for the
            # deleted app in between); on a cluster only our app goes.
            if shared and app is not None:
                with contextlib.suppress(Exception):
                    serve.delete(app)
            if not shared:
                with contextlib.suppress(Exception):
                    serve.shutdown()
            if board is not None:
                with contextlib.suppress(Exception):
                    ray.kill(board)
    finally:
        if owns_ray and ray.is_initialized():
            ray.shutdown()


def start(run_dir: Path, spec: ServingSpec, variant: str | None = None, port: int = 0,
          address: str | None = None) -> Server:
    """Serves a variant of `run_dir` as `spec` says; returns once it answers HTTP."""
    variant, folder, fmt, fingerprint = resolve(Path(run_dir), variant)
    ray = _need_ray()
    from ray import serve

    from compress.serving.app import Front, FrontConfig, Model, ModelConfig, Replica
    from compress.serving.stats import Batching, StatsBoard

    srv = spec.server
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # not a line per deployment on the terminal
    port = port or _free_port(srv.host)
    if address is None:
        _check_port(srv.host, port)
    owns_ray = not ray.is_initialized()
    app, board = None, None
    try:
        if owns_ray:
            _init_local_ray(ray) if address is None else ray.init(address=address, log_to_driver=False,
                                                                   logging_level=logging.WARNING)
        cpus = ray.cluster_resources().get("CPU", 0)
        fewest = srv.autoscaling.min_replicas if srv.autoscaling else srv.num_replicas
        if fewest * srv.threads > cpus:
            raise CompressError(f"serving.server: {fewest} model replica(s) x {srv.threads} thread(s) need "
                                f"{fewest * srv.threads} CPUs; Ray has {cpus:g}; lower num_replicas or threads")
        serve.start(http_options={"host": srv.host, "port": port}, proxy_location="HeadOnly",
                    logging_config={"log_level": "WARNING"})
        drain = {"graceful_shutdown_wait_loop_s": 0.2, "graceful_shutdown_timeout_s": srv.drain_timeout_s}
        scale = ({"autoscaling_config": {"min_replicas": srv.autoscaling.min_replicas,
                                         "max_replicas": srv.autoscaling.max_replicas,
                                         "target_ongoing_requests": srv.autoscaling.target_ongoing_requests,
                                         "upscale_delay_s": 2.0, "downscale_delay_s": 30.0}}
                 if srv.autoscaling else {"num_replicas": srv.num_replicas})
        batching = Batching(max_batch_size=srv.max_batch_size, batch_wait_timeout_s=srv.batch_wait_timeout_s)
        board = ray.remote(num_cpus=0)(StatsBoard).remote(variant, spec.cache.kind, fmt == "cascade", batching)
        # Batching changes later through the board (Server.set_batching): Serve's user_config
        # would do, but serve.run gives each deployment a new version and so new replicas.
        model_config = ModelConfig(folder=str(folder), threads=srv.threads, max_length=srv.max_length,
                                   batching=batching)
        front_config = FrontConfig(variant=variant, fingerprint=fingerprint, cache=spec.cache, limits=spec.limits,
                                   batching=batching)
        if srv.topology == "one_hop":
            front = Replica.options(**scale, **drain, max_ongoing_requests=max(srv.max_ongoing_requests, 1000),
                                    ray_actor_options={"num_cpus": srv.threads}).bind(model_config, front_config,
                                                                                        board)
        else:
            model = Model.options(**scale, **drain, max_ongoing_requests=srv.max_ongoing_requests,
                                  ray_actor_options={"num_cpus": srv.threads}).bind(model_config, board)
            front = Front.options(num_replicas=srv.ingress_replicas, **drain, max_ongoing_requests=1000,
                                  ray_actor_options={"num_cpus": 0}).bind(model, front_config, board)
        app = f"compress-{variant}-{uuid.uuid4().hex[:6]}"
        try:
            serve.run(front, name=app, route_prefix="/", blocking=False)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
            raise CompressError(f"{folder}: the server did not start ({first}); check that the variant loads "
                                f"(`compress gate` or the benchmark) and the Ray Serve logs") from exc
        url = f"http://{'127.0.0.1' if srv.host in ('0.0.0.0', '::') else srv.host}:{port}"
        server = Server(url, variant, fingerprint, app, board, owns_ray, address is not None, srv.drain_timeout_s,
                        batching)
        server._max_ongoing = srv.max_ongoing_requests
        return server
    except BaseException:  # Ctrl-C or a failure half way: nothing is left running
        _teardown(app, board, owns_ray, address is not None)
        raise
