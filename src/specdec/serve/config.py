"""What one `specdec serve` process is told: the model, its methods, its limits, and how it shares them.

Why apart from app.py: the CLI, the tests and the benchmarks build a `ServerConfig`
without building the app, and every bound a request meets is one field here,
checked once.

Invariants: a `ServerConfig` that exists is valid (bad values raise ValueError
when it is made, a bad method spec included, so nothing fails per request for a
reason the operator gave); it is frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.choices import ModelSpec
from specdec.proposers import MethodError
from specdec.serve.options import MethodSettings
from specdec.serve.pool import DEFAULT_CAPACITY


@dataclass(frozen=True)
class ServerConfig:
    # the one model this server loads, and how it verifies; its `exact` has the server's stronger reading
    # of "auto": on wherever the model's path can, even where that costs tokens/s (specdec.serve.exactness)
    model: ModelSpec = ModelSpec()
    method: str = "logitspec"  # default method spec for requests without "specdec.method"
    # "METHOD:opt=value,..." each: server-side settings of a method (paths, quantize, calibration...),
    # prepared at startup; see specdec.serve.options
    method_configs: tuple[str, ...] = ()
    pool_capacity: int = DEFAULT_CAPACITY  # distinct method configs whose proposers are kept
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()  # each one lets clients in; learned state is kept per key
    admin_keys: tuple[str, ...] = ()  # what /metrics needs wherever keys are set (a client key gets 403)
    max_queue: int = 64  # requests waiting (the running ones not counted) before 429
    max_batch: int = 8  # requests decoded together (continuous batching); 1: one at a time
    # one API key's share of the waiting requests (None: an equal share of max_queue among the keys, all
    # of it without keys) and of the batch rows (None: all); admission is round-robin across keys
    max_queue_per_key: int | None = None
    max_rows_per_key: int | None = None
    max_tokens_limit: int = 1024  # largest max_tokens a request may ask for
    max_body_bytes: int = 1 << 20
    shutdown_timeout_s: float = 30.0
    request_timeout_s: float = 30.0  # for a request's headers, and again for its body; then 408
    # prompt tokens prefilled per step while others decode (None: sized from the measured cost curve so
    # a joining prompt stretches a running stream's gap at most ~3x: specdec.serve.prefill)
    prefill_chunk: int | None = None
    expose_stats: bool = False  # add each request's decoding statistics to its reply
    ui: bool = True  # serve the browser playground at / (specdec.serve.playground); --no-ui: JSON only
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.max_queue < 0 or self.max_tokens_limit < 1 or self.max_body_bytes < 1024:
            raise ValueError("max_queue must be >= 0, max_tokens_limit >= 1 and max_body_bytes >= 1024")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if any(not key.strip() for key in (*self.api_keys, *self.admin_keys)):
            raise ValueError("an API key is empty")
        if not self.request_timeout_s > 0 or (self.prefill_chunk is not None and self.prefill_chunk < 1):
            raise ValueError("request_timeout_s must be > 0 and prefill_chunk >= 1")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if (self.max_queue_per_key or 0) < 0 or (self.max_rows_per_key is not None and self.max_rows_per_key < 1):
            raise ValueError("max_queue_per_key must be >= 0 and max_rows_per_key >= 1")
        if self.pool_capacity < 1:
            raise ValueError(f"pool_capacity must be >= 1, got {self.pool_capacity}")
        if not isinstance(self.model, ModelSpec):
            raise ValueError(f"model must be a ModelSpec, got {type(self.model).__name__}")
        self.method_settings()  # a bad method spec fails at startup, not per request

    @property
    def queue_share(self) -> int:
        """Waiting requests one API key may hold."""
        if self.max_queue_per_key is not None:
            return self.max_queue_per_key
        return -(-self.max_queue // max(1, len(self.api_keys)))  # ceiling: the shares cover the queue

    def method_settings(self) -> MethodSettings:
        try:
            return MethodSettings.from_specs(self.method, self.method_configs)
        except MethodError as error:
            raise ValueError(f"bad --method or --method-config: {error}") from None
