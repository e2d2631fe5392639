"""Prometheus metrics, in the text exposition format (no client library needed)."""

from __future__ import annotations

import threading
from collections import defaultdict

from engine.api import Timings, Usage

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ENGINE_GAUGES = (  # engine.stats() key, metric, help
    ("running", "qwendesk_requests_running", "Requests decoding now."),
    ("waiting", "qwendesk_requests_waiting", "Requests in the engine's queue (queue depth)."),
    ("kv_pages_used", "qwendesk_kv_pages_used", "KV cache pages held by requests."),
    ("kv_pages_cached", "qwendesk_kv_pages_cached", "KV cache pages kept for prefix reuse."),
    ("kv_pages_total", "qwendesk_kv_pages_total", "KV cache pages in the pool."),
    ("state_slots_used", "qwendesk_state_slots_used", "GDN state slots held by running requests."),
    ("snapshots_cached", "qwendesk_snapshots_cached", "GDN state snapshots kept for prefix reuse."),
    ("spec_drafts", "qwendesk_speculative_drafts",
     "Most drafts per speculative round, MTP or block drafter (0: no speculation)."),
    ("spec_on", "qwendesk_speculating", "1 while rounds pay (else plain steps for a while)."),
    ("host_pages", "qwendesk_host_cache_pages", "KV pages kept in the host-RAM tier."),
    ("host_snapshots", "qwendesk_host_cache_snapshots", "GDN snapshots kept in the host-RAM tier."),
    ("host_bytes", "qwendesk_host_cache_bytes", "Host memory the host-RAM tier holds."),
    ("disk_pages", "qwendesk_disk_cache_pages", "KV pages in the disk tier."),
    ("disk_snapshots", "qwendesk_disk_cache_snapshots", "GDN snapshots in the disk tier."),
    ("disk_bytes", "qwendesk_disk_cache_bytes", "Bytes of the disk tier's folder."),
    ("disk_staging_bytes", "qwendesk_disk_cache_staging_bytes",
     "Host memory the disk tier stages its writes in (pinned on a GPU, allocated on the first write): its bound."),
    ("gpu_allocated_bytes", "qwendesk_gpu_memory_allocated_bytes",
     "GPU memory held by tensors: weights, cache pools, buffers in use (0 on the CPU)."),
    ("gpu_reserved_bytes", "qwendesk_gpu_memory_reserved_bytes",
     "GPU memory torch's caching allocator holds from the driver: in use, and freed but kept for reuse."),
    ("pinned_host_bytes", "qwendesk_pinned_host_memory_bytes",
     "Page-locked host memory torch's pinned allocator holds (in use and kept for reuse): the host tier's slabs, the "
     "disk tier's write staging, small transfer buffers (0 on the CPU)."),
)
ENGINE_COUNTERS = (  # engine.stats() key, metric, help
    ("prefix_hit_tokens", "qwendesk_prefix_cache_hit_tokens_total", "Prompt tokens reused from the prefix cache."),
    ("spec_rounds", "qwendesk_speculative_rounds_total", "Speculative rounds, one per sequence in each."),
    ("spec_drafted_tokens", "qwendesk_speculative_drafted_tokens_total", "Draft tokens proposed."),
    ("spec_accepted_tokens", "qwendesk_speculative_accepted_tokens_total", "Draft tokens kept."),
    ("host_hit_pages", "qwendesk_host_cache_hit_pages_total", "KV pages restored from the host-RAM tier."),
    ("disk_hit_pages", "qwendesk_disk_cache_hit_pages_total", "KV pages read from the disk tier."),
    ("host_hit_snapshots", "qwendesk_host_cache_hit_snapshots_total", "GDN snapshots restored from the host-RAM tier."),
    ("disk_hit_snapshots", "qwendesk_disk_cache_hit_snapshots_total", "GDN snapshots read from the disk tier."),
    ("disk_write_errors", "qwendesk_disk_cache_write_errors_total", "Disk tier writes that failed (IO errors)."),
    ("disk_rejected", "qwendesk_disk_cache_rejected_total", "Disk tier files removed as corrupt or foreign."),
)


class Histogram:
    def __init__(self, buckets=LATENCY_BUCKETS):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}",
                      f"{name}_count {self.count}"]


OUTCOMES = ("completed", "failed", "abandoned", "dropped")


class Outcome:
    """How one generation request ended, counted once: completed (its reply went out whole), failed (the
    reply is an error: the engine failed, or shut down), abandoned (the client left before a reply that is
    not streamed), dropped (the client cut a stream midway). Started = the four + those in flight."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.failed = False                     # a generation of it finished with an error
        self.ended: str | None = None
        metrics.count("started")

    def end(self, how: str | None = None) -> None:
        """`how`: abandoned | dropped; None: completed or failed, as its generations finished."""
        if self.ended is None:
            self.ended = how or ("failed" if self.failed else "completed")
            self.metrics.count(self.ended)


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.outcomes = defaultdict(int)        # started | completed | failed | abandoned | dropped -> count
        self.requests = defaultdict(int)        # (route, status) -> count
        self.finishes = defaultdict(int)        # finish reason -> count
        self.tokens = defaultdict(int)          # prompt | completion | cached | reasoning -> count
        self.ttft = Histogram()
        self.latency = Histogram()

    def count(self, outcome: str) -> None:
        with self.lock:
            self.outcomes[outcome] += 1

    def request(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] += 1

    def finished(self, reason: str, usage: Usage, timings: Timings | None) -> None:
        with self.lock:
            self.finishes[reason] += 1
            self.tokens["prompt"] += usage.prompt_tokens
            self.tokens["completion"] += usage.completion_tokens
            self.tokens["cached"] += usage.cached_tokens
            self.tokens["reasoning"] += usage.reasoning_tokens
            if timings is not None and timings.ttft_ms > 0:
                self.ttft.observe(timings.ttft_ms / 1e3)
            if timings is not None:
                self.latency.observe(timings.total_ms / 1e3)

    def render(self, engine_stats: dict | None) -> str:
        with self.lock:
            out = ["# HELP qwendesk_http_requests_total HTTP requests by route and status.",
                   "# TYPE qwendesk_http_requests_total counter"]
            out += [f'qwendesk_http_requests_total{{route="{r}",status="{s}"}} {n}'
                    for (r, s), n in sorted(self.requests.items())]
            out += ["# HELP qwendesk_generation_requests_started_total Generation requests submitted to the engine.",
                    "# TYPE qwendesk_generation_requests_started_total counter",
                    f"qwendesk_generation_requests_started_total {self.outcomes['started']}",
                    "# HELP qwendesk_generation_requests_total Generation requests ended, by outcome: completed, "
                    "failed, abandoned (client left before the reply), dropped (stream cut midway).",
                    "# TYPE qwendesk_generation_requests_total counter"]
            out += [f'qwendesk_generation_requests_total{{outcome="{o}"}} {self.outcomes[o]}' for o in OUTCOMES]
            out += ["# HELP qwendesk_generations_total Generations by finish reason.",
                    "# TYPE qwendesk_generations_total counter"]
            out += [f'qwendesk_generations_total{{reason="{r}"}} {n}' for r, n in sorted(self.finishes.items())]
            for kind, text in (("prompt", "Prompt tokens."), ("completion", "Generated tokens."),
                               ("cached", "Prompt tokens served from the prefix cache."),
                               ("reasoning", "Generated tokens spent thinking.")):
                name = f"qwendesk_{kind}_tokens_total"
                out += [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {self.tokens[kind]}"]
            for name, hist, text in (("qwendesk_time_to_first_token_seconds", self.ttft, "Submit to first token."),
                                     ("qwendesk_request_latency_seconds", self.latency, "Submit to last token.")):
                out += [f"# HELP {name} {text}", f"# TYPE {name} histogram"] + hist.lines(name)
        if engine_stats is not None:
            for kind, table in (("gauge", ENGINE_GAUGES), ("counter", ENGINE_COUNTERS)):
                for key, name, text in table:
                    value = int(engine_stats.get(key, 0))
                    out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {value}"]
            method = engine_stats.get("spec_method", "off")
            out += ["# HELP qwendesk_speculation_method How the engine drafts: mtp, dflash (a block drafter) or off.",
                    "# TYPE qwendesk_speculation_method gauge", f'qwendesk_speculation_method{{method="{method}"}} 1']
        out += ["# HELP qwendesk_ready 1 once the model is loaded.", "# TYPE qwendesk_ready gauge",
                f"qwendesk_ready {int(engine_stats is not None)}"]
        return "\n".join(out) + "\n"


class MetricsMiddleware:
    """Counts every HTTP request by its route (the path template, never the raw path) and status."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            self.metrics.request(getattr(route, "path", "unmatched"), status)
