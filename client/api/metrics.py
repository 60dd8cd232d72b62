"""`/metrics` of the gateway: request latencies and token counts under vLLM's names.

vLLM's dashboards read `vllm:time_to_first_token_seconds`, `vllm:num_requests_running`, ...;
ours are the same names under `layerswarm:`, so a dashboard needs one prefix swapped. Metrics
live on a private CollectorRegistry (two gateways in one test process do not collide).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

P = "layerswarm:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds. Swarm tokens take tens to hundreds of ms; first tokens include a route and a prefill.
TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0)


class ApiMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["model_name"]
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time from request arrival to its first token",
                              labels, registry=r, buckets=TTFT_BUCKETS).labels(model_name)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "Time between two tokens of one request",
                              labels, registry=r, buckets=TPOT_BUCKETS).labels(model_name)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Time from request arrival to its last token",
                             labels, registry=r, buckets=E2E_BUCKETS).labels(model_name)
        self.running = Gauge(P + "num_requests_running", "Requests generating now", labels, registry=r).labels(model_name)
        self.waiting = Gauge(P + "num_requests_waiting", "Requests waiting for a free generation slot", labels,
                             registry=r).labels(model_name)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests", labels,
                                     registry=r).labels(model_name)
        self.generation_tokens = Counter(P + "generation_tokens", "Tokens generated", labels,
                                         registry=r).labels(model_name)
        self._success = Counter(P + "request_success", "Requests answered in full, by finish reason",
                                [*labels, "finished_reason"], registry=r)
        self._failure = Counter(P + "request_failure", "Requests answered with an error, by HTTP status",
                                [*labels, "status"], registry=r)
        self._aborted = Counter(P + "request_aborted", "Requests whose client went away before the end", labels,
                                registry=r).labels(model_name)
        self.model_name = model_name


    def success(self, finish_reason: str) -> None:
        self._success.labels(self.model_name, finish_reason).inc()

    def failure(self, status: int) -> None:
        self._failure.labels(self.model_name, str(status)).inc()

    def aborted(self) -> None:
        self._aborted.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


METRICS = web.AppKey("metrics", ApiMetrics)  # where the app keeps them (app.py, streaming.py)
