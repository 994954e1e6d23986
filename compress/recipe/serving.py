"""The recipe's `serving:` block: how a variant is served (batching, replicas, threads, the
result cache, request limits), the load it is measured under, the traffic it is sized for
and the prices that turn instances into $/month. Pydantic only: validated with the recipe,
before any model loads."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- the server (owned by the serve work) ---------------------------------------------


class AutoscalingSpec(_Strict):
    """Ray Serve's autoscaling on ongoing requests per replica, instead of a fixed count."""

    min_replicas: PositiveInt = Field(1, le=256, description="Fewest model replicas kept running.")
    max_replicas: PositiveInt = Field(2, le=256, description="Most model replicas started under load (each "
                                      "reserves `threads` CPUs: more than the machine has never start).")
    target_ongoing_requests: PositiveFloat = Field(
        8.0, le=10_000, description="Ongoing requests (texts queued or in a batch) per replica that autoscaling "
        "aims at: above it replicas are added, below it removed.")

    @model_validator(mode="after")
    def _order(self):
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self


class ServerSpec(_Strict):
    """How `compress serve` runs the variant on Ray Serve. The defaults suit a 2-core machine."""

    host: str = Field("127.0.0.1", min_length=1, max_length=255,
                      description="Address the HTTP server listens on; 0.0.0.0 to accept other machines.")
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free one (printed at start).")
    max_batch_size: PositiveInt = Field(
        8, le=1024, description="Most texts one model call takes (Ray Serve's @serve.batch, counted in texts: "
        "a request's texts may share a batch with other requests'); 1 serves unbatched.")
    batch_wait_timeout_s: PositiveFloat = Field(
        0.005, le=10, description="Longest a text waits for a batch to fill before the model runs what it has.")
    num_replicas: PositiveInt = Field(1, le=256, description="Model replicas (processes), each with its own "
                                      "copy of the model; not with `autoscaling`.")
    autoscaling: AutoscalingSpec | None = Field(None, description="Scale the model replicas on ongoing requests "
                                                 "(instead of `num_replicas`).")
    threads: PositiveInt = Field(1, le=256, description="Intra-op threads of the runtime in each model replica "
                                 "(torch, ONNX Runtime, OpenVINO); each replica reserves as many Ray CPUs.")
    ingress_replicas: PositiveInt = Field(1, le=64, description="Replicas of the HTTP front (request checks, "
                                          "the cache, metrics); it does no model work.")
    max_ongoing_requests: PositiveInt = Field(
        64, le=100_000, description="Model calls a model replica takes at once (queued for a batch or in one); "
        "at least max_batch_size, or batches never fill.")
    max_length: PositiveInt = Field(128, le=8192, description="Tokens a text is cut to, as in the benchmark.")
    drain_timeout_s: PositiveFloat = Field(
        10.0, le=600, description="On SIGTERM or Ctrl-C, the longest the server waits for requests in flight.")

    @model_validator(mode="after")
    def _consistent(self):
        if self.max_ongoing_requests < self.max_batch_size:
            raise ValueError(f"max_ongoing_requests ({self.max_ongoing_requests}) is below max_batch_size "
                             f"({self.max_batch_size}): a batch could never fill; raise it")
        if self.autoscaling is not None and "num_replicas" in self.model_fields_set:
            raise ValueError("give either num_replicas or autoscaling, not both")
        return self


class CacheSpec(_Strict):
    """The result cache in front of the model: texts already answered are not run again."""

    kind: Literal["none", "memory", "redis"] = Field(
        "memory", description="`memory`: a bounded LRU in each HTTP front replica; `redis`: a Redis server "
        "that every replica shares (`url`); `none`: no cache.")
    url: str | None = Field(None, max_length=2048, description="The Redis server of kind `redis`: "
                            "redis://HOST:PORT/DB, rediss:// (TLS) or unix:///PATH.")
    ttl_s: PositiveFloat = Field(3600.0, le=30 * 86400, description="How long an answer stays cached.")
    max_entries: PositiveInt = Field(100_000, le=100_000_000, description="Most answers the `memory` cache "
                                     "holds; the least recently used go first.")
    timeout_s: PositiveFloat = Field(0.25, le=30, description="Longest a Redis call may take before the request "
                                     "goes on without the cache.")
    retry_s: PositiveFloat = Field(5.0, le=3600, description="After a Redis failure, how long the server runs "
                                   "without the cache before it tries Redis again.")

    @model_validator(mode="after")
    def _url(self):
        if self.kind == "redis" and not self.url:
            raise ValueError("kind redis needs serving.cache.url (e.g. redis://127.0.0.1:6379/0)")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"serving.cache.url '{self.url[:100]}' is not a Redis URL; give redis://HOST:PORT/DB, "
                             f"rediss:// or unix:///PATH")
        return self


class LimitSpec(_Strict):
    """Requests beyond these are answered 4xx before they reach the model."""

    max_body_bytes: PositiveInt = Field(1 << 20, le=1 << 30, description="Largest request body, in bytes (413).")
    max_texts: PositiveInt = Field(256, le=100_000, description="Most texts in one request (413).")
    max_text_chars: PositiveInt = Field(10_000, le=10_000_000, description="Longest text, in characters (413); "
                                        "the model reads only its first max_length tokens.")


# --- the load, the traffic and the prices (owned by the load work) ---------------------


class LoadSpec(_Strict):
    pass


class TrafficSpec(_Strict):
    pass


class PricingSpec(_Strict):
    pass


class ServingSpec(_Strict):
    server: ServerSpec = Field(default_factory=ServerSpec)
    cache: CacheSpec = Field(default_factory=CacheSpec)
    limits: LimitSpec = Field(default_factory=LimitSpec)
    load: LoadSpec = Field(default_factory=LoadSpec)
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    pricing: PricingSpec = Field(default_factory=PricingSpec)
