"""Prometheus metrics of one `specdec serve` process (GET /metrics).

Why: operators compare methods by the same numbers the benchmark reports (MAT,
accepted tokens, time per step), so the server counts them per method, as
Prometheus counters and histograms that any scraper understands.

Invariants:
- every metric lives in this object's own `CollectorRegistry`: two servers in
  one process (tests) never share counts, and nothing global is touched;
- a finished request is counted once, with outcome "completed", "cancelled"
  (client gone or server shutting down) or "failed"; its tokens, forward passes
  and steps are added only when it completed, so token counters equal the sum of
  the `usage` fields the server returned;
- text chunks are counted as they are handed out, cancelled requests included,
  which shows how early a cancelled generation stopped;
- updates come from the worker thread and the event loop; prometheus_client's
  metrics are thread-safe.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from specdec.engine.generation import GenerationStats

STEP_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
KNOWN_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/openapi.json", "/docs"}
)
OUTCOMES = ("completed", "cancelled", "failed")


class ServerMetrics:
    """The counters, gauges and histograms of one server."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        by_method = ["method"]
        r = self.registry
        self.requests = Counter(
            "specdec_requests",
            "Generation requests by endpoint, method and outcome",
            ["endpoint", "method", "outcome"],
            registry=r,
        )
        self.http_responses = Counter(
            "specdec_http_responses", "HTTP responses by path and status code", ["path", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "specdec_prompt_tokens", "Prompt tokens of completed requests", by_method, registry=r
        )
        self.completion_tokens = Counter(
            "specdec_completion_tokens", "Generated tokens of completed requests", by_method, registry=r
        )
        self.forward_passes = Counter(
            "specdec_forward_passes", "Target forward passes (prefill included)", by_method, registry=r
        )
        self.drafted_tokens = Counter(
            "specdec_drafted_tokens", "Draft tokens proposed", by_method, registry=r
        )
        self.accepted_tokens = Counter(
            "specdec_accepted_tokens", "Draft tokens accepted", by_method, registry=r
        )
        self.text_chunks = Counter(
            "specdec_text_chunks",
            "Text pieces handed out (cancelled requests included)",
            by_method,
            registry=r,
        )
        self.step_seconds = Histogram(
            "specdec_step_seconds",
            "Time per decoding step (draft + verify)",
            by_method,
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.generation_seconds = Histogram(
            "specdec_generation_seconds",
            "Wall time of a completed generation",
            by_method,
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.queue_seconds = Histogram(
            "specdec_queue_wait_seconds",
            "Time from submission to the start of generation",
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.waiting = Gauge("specdec_waiting_requests", "Requests waiting in the queue", registry=r)
        self.running = Gauge("specdec_running_requests", "Requests being generated (0 or 1)", registry=r)

    def record_outcome(self, endpoint: str, method: str, outcome: str, stats: GenerationStats | None) -> None:
        """Count one finished request; add its token and step counts when it completed."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        self.requests.labels(endpoint, method, outcome).inc()
        if outcome != "completed" or stats is None:
            return
        self.prompt_tokens.labels(method).inc(stats.num_prompt_tokens)
        self.completion_tokens.labels(method).inc(stats.num_new_tokens)
        self.forward_passes.labels(method).inc(stats.num_forward_passes)
        self.generation_seconds.labels(method).observe(stats.wall_time_s)
        steps = self.step_seconds.labels(method)
        for step in stats.steps:
            steps.observe(step.draft_s + step.verify_s)
        self.drafted_tokens.labels(method).inc(sum(s.tree_size - 1 for s in stats.steps))
        self.accepted_tokens.labels(method).inc(sum(s.num_accepted for s in stats.steps))

    def record_response(self, path: str, status: int) -> None:
        self.http_responses.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
