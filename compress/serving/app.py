"""The Ray Serve application: an HTTP front (checks, cache, metrics) and the model.

    HTTP -> Serve proxy -> front: route, limits, body checks, the result cache, metrics
                           -> Batcher.predict(chunk of texts)   @serve.batch, counted in texts
                              (batches mix the texts of concurrent requests; replicas by
                              count or by autoscaling on ongoing requests)

Two topologies (serving.server.topology): `one_hop` (the default) runs front and model in
one `Replica`, so a request crosses one process boundary; `front_and_model` runs the front
in its own replicas (`Front`) and the model in `Model`'s, a second hop per request that
lets the fronts scale apart from the model.

Only requests that pass every check reach the batched call, so a flood of bad requests costs
the model nothing. Imported only by compress.serving.server (it imports Ray).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from pydantic import BaseModel, ConfigDict
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from compress.recipe.serving import CacheSpec, LimitSpec
from compress.serving.api import BadRequest, check_length, error_body, parse_predict, route
from compress.serving.cache import Prediction, cache_key, make_cache
from compress.serving.stats import BATCH_BOUNDS, FLUSH_S, Batching, Counts, Orders, prometheus

log = logging.getLogger("compress.serving")


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    folder: str
    threads: int
    max_length: int
    batching: Batching  # the first; later ones come with the board's orders


class FrontConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    variant: str
    fingerprint: str
    cache: CacheSpec
    limits: LimitSpec
    batching: Batching


class _Reporter:
    """A replica's side of the StatsBoard: every FLUSH_S it sends its cumulative counts (when
    they changed) and takes the board's orders (draining; the batching) in the answer."""

    def __init__(self, board, batching: Batching, on_batching):
        self.board, self.id, self.counts = board, uuid.uuid4().hex[:12], Counts()
        self.batching, self.on_batching = batching, on_batching
        self.cache_up: bool | None = None
        self.draining = False
        self._dirty, self._task = False, None
        with contextlib.suppress(RuntimeError):  # Serve builds replicas inside their event loop
            self._start()

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def changed(self) -> None:
        self._dirty = True
        self._start()  # where __init__ had no running loop to start it in

    def flush(self):
        """Sends the counts; the reference resolves to the board's Orders."""
        dirty, self._dirty = self._dirty, False
        return self.board.report.remote(self.id, self.counts.model_copy(deep=True) if dirty else None, self.cache_up)

    def obey(self, orders: Orders) -> None:
        self.draining = orders.draining
        if orders.batching != self.batching:
            self.batching = orders.batching
            self.on_batching(orders.batching)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                self.obey(await self.flush())
            except Exception:  # the board is gone (shutting down): counts no longer matter
                return


def _texts_in(chunks: list[list[str]]) -> int:
    return sum(len(c) for c in chunks)


class Batcher:
    """One copy of the variant; answers chunks of texts, batched across requests. A plain
    class: the `Model` deployment is one, and a `Replica` holds one beside its front."""

    def __init__(self, config: ModelConfig, board):
        import os

        from compress.techniques.classify import load_classifier

        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.classifier = load_classifier(config.folder, threads=config.threads, max_length=config.max_length)
        try:  # torch formats: intra-op threads are torch's, set per process
            import sys

            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(config.threads)
        except Exception:
            pass
        pred = self.classifier.predictor
        self.cascade = hasattr(pred, "routed_share")
        self._batching(config.batching)
        self.reporter = _Reporter(board, config.batching, self._batching)
        board.join.remote(self.reporter.id)

    def _batching(self, b: Batching) -> None:
        """Applies batching at runtime: the next batch the queue forms follows it."""
        self.batching = b
        self.predict.set_max_batch_size(b.max_batch_size)
        self.predict.set_batch_wait_timeout_s(b.batch_wait_timeout_s)

    def _run(self, texts: list[str]) -> tuple[list[Prediction], int]:
        pred = self.classifier.predictor
        if self.cascade:  # the cascade counts what it routes since its last reset: this batch's
            pred.reset_counts()
        out = [Prediction(**o[0]) for o in self.classifier(texts)]
        return out, round((pred.routed_share or 0.0) * len(texts)) if self.cascade else 0

    # max_batch_size here is only the first value: __init__ sets the recipe's.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, batch_size_fn=_texts_in)
    async def predict(self, chunks: list[list[str]]) -> list[list[Prediction]]:
        flat = [t for c in chunks for t in c]
        # In a thread: the replica's event loop keeps queueing the next batch and answering
        # health checks while the model runs.
        out, routed = await asyncio.to_thread(self._run, flat)
        return self._answered(chunks, flat, out, routed)

    def predict_now(self, chunk: list[str]) -> list[Prediction]:
        """One chunk at once, in the caller's thread: no batch queue and no thread hand-off,
        which cost a request more than a small model's call does. For max_batch_size 1,
        where there is no batch to wait for."""
        out, routed = self._run(chunk)
        return self._answered([chunk], chunk, out, routed)[0]

    def _answered(self, chunks: list[list[str]], flat: list[str], out: list[Prediction],
                  routed: int) -> list[list[Prediction]]:
        """Counts a model call (batch size, routed rows) and splits its answers by chunk."""
        c = self.reporter.counts
        c.batch_sizes[len(flat)] = c.batch_sizes.get(len(flat), 0) + 1
        if self.cascade:
            c.cascade_rows += len(flat)
            c.cascade_routed += routed
        self.reporter.changed()
        answers, i = [], 0
        for chunk in chunks:
            answers.append(out[i: i + len(chunk)])
            i += len(chunk)
        return answers

    def __del__(self):
        try:  # scaled down or shut down: no longer counted as running
            self.reporter.flush()
            self.reporter.board.leave.remote(self.reporter.id)
        except Exception:
            pass


Model = serve.deployment(Batcher, name="Model")


class FrontBase:
    """The HTTP front: checks, the cache, metrics; the model's work goes to `_run_chunk`."""

    def __init__(self, model, config: FrontConfig, board):
        self.model, self.config, self.board = model, config, board
        self.cache = make_cache(config.cache)
        self.max_batch_size = config.batching.max_batch_size
        self.reporter = _Reporter(board, config.batching, self._batching)

    def _batching(self, b: Batching) -> None:
        self.max_batch_size = b.max_batch_size

    async def __call__(self, request: Request) -> Response:
        start = time.perf_counter()
        c, r = self.reporter.counts, self.reporter
        c.in_flight += 1
        r.changed()
        try:
            response = await self._answer(request)
        except BadRequest as bad:
            response = Response(error_body(bad.message), status_code=bad.status, media_type="application/json",
                                headers=bad.headers)
        except Exception as exc:  # the model or Serve failed on a valid request: 500, and keep serving
            log.exception("predict failed")
            response = Response(error_body(f"the model failed on this request ({type(exc).__name__}); "
                                           f"see the server's log"), status_code=500, media_type="application/json")
        finally:
            c.in_flight -= 1
        c.requests[response.status_code] = c.requests.get(response.status_code, 0) + 1
        c.latency.observe(time.perf_counter() - start)
        r.cache_up, c.cache_errors = self.cache.up, self.cache.errors
        r.changed()
        return response

    async def _answer(self, request: Request) -> Response:
        path = route(request.method, request.url.path)
        if path == "/healthz":
            if self.reporter.draining:  # load balancers take this instance out
                return JSONResponse({"status": "draining", "variant": self.config.variant}, status_code=503)
            return JSONResponse({"status": "ok", "variant": self.config.variant, "fingerprint": self.config.fingerprint,
                                 "cache": self.cache.kind if self.cache.up is not False else f"{self.cache.kind} (down)"})
        if path == "/metrics":
            self.reporter.cache_up, self.reporter.counts.cache_errors = self.cache.up, self.cache.errors
            self.reporter.changed()
            self.reporter.obey(await self.reporter.flush())  # ours current, the others' FLUSH_S old at most
            stats = await self.board.total.remote()
            return Response(prometheus(stats), media_type="text/plain; version=0.0.4; charset=utf-8")
        if self.reporter.draining:
            raise BadRequest(503, "the server is shutting down; send the request to another instance",
                             {"Retry-After": "1"})
        check_length(request.headers.get("content-length"), self.config.limits)
        texts = parse_predict(await request.body(), self.config.limits)
        return JSONResponse({"predictions": [p.model_dump() for p in await self._predict(texts)]})

    async def _predict(self, texts: list[str]) -> list[Prediction]:
        keys = [cache_key(t, self.config.fingerprint) for t in texts]
        answers = await self.cache.get_many(keys)
        # The texts to run, each once however often the request repeats it.
        todo: dict[str, str] = {}
        for k, t, a in zip(keys, texts, answers):
            if a is None:
                todo.setdefault(k, t)
        c = self.reporter.counts
        c.cache_misses += len(todo) if self.cache.kind != "none" else 0
        c.cache_hits += sum(a is not None for a in answers)
        c.texts += len(texts)
        if todo:
            miss_keys, miss_texts = list(todo), list(todo.values())
            step = max(1, min(self.max_batch_size, BATCH_BOUNDS[-1]))  # a chunk never exceeds a batch
            chunks = [miss_texts[i: i + step] for i in range(0, len(miss_texts), step)]
            results = await asyncio.gather(*(self._run_chunk(ch) for ch in chunks))
            fresh = dict(zip(miss_keys, (p for r in results for p in r)))
            await self.cache.put_many(list(fresh.items()))
            answers = [a if a is not None else fresh[k] for k, a in zip(keys, answers)]
        return answers

    def _run_chunk(self, chunk: list[str]):
        """An awaitable of the model's answers to `chunk`: a call to the Model deployment."""
        return self.model.predict.remote(chunk)


@serve.deployment
class Front(FrontBase):
    """The front of topology `front_and_model`: its own replicas, the model in `Model`'s."""


@serve.deployment
class Replica(FrontBase):
    """Topology `one_hop`: the front and the model in one replica, so a request crosses one
    process boundary (Serve's proxy to the replica), not two; replicas scale both together."""

    def __init__(self, model_config: ModelConfig, config: FrontConfig, board):
        super().__init__(Batcher(model_config, board), config, board)

    async def _run_chunk(self, chunk: list[str]) -> list[Prediction]:
        if self.model.batching.max_batch_size == 1:  # unbatched: straight to the model
            return self.model.predict_now(chunk)
        return await self.model.predict(chunk)  # the batched call in this process
