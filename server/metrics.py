"""Prometheus metrics of one server (its own registry), named like vLLM's where vLLM has the figure:
``specexec:spec_decode_num_drafts`` is vLLM's ``vllm:spec_decode_num_drafts``. Requests are counted
when they finish, from their own metrics; the gauges are read from the executor at each scrape.

The figures routers read are also served under vLLM's own names, with its ``model_name`` label
(`VLLM_TWINS`): the queue (``vllm:num_requests_waiting`` / ``_running``), the KV cache's usage as a
fraction (``vllm:kv_cache_usage_perc``, and ``vllm:gpu_cache_usage_perc``, its older name, which
some still read), the token and request counters and the spec-decode counters. The Gateway API
inference extension's endpoint picker, llm-d and the vLLM production stack's router pick a replica by
them."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from ..executor.engine.request import RequestOutput

disable_created_metrics()  # no *_created series beside each counter (as vLLM's /metrics)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)


#: our series also served under vLLM's name, ``vllm:<name>`` (counters: the name before ``_total``)
VLLM_TWINS = frozenset(
    {
        "request_success",
        "prompt_tokens",
        "generation_tokens",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
        "spec_decode_num_accepted_tokens_per_pos",
    }
)


class _Twins:
    """One counter under our name and its twin under vLLM's, labelled with the model's name (a
    counter with labels of its own: the parents, until `labels` picks the children)."""

    def __init__(self, ours: Counter, theirs: Counter | None, model_name: str) -> None:
        self.ours, self.theirs, self.model_name = ours, theirs, model_name

    def labels(self, **labels: str) -> _Twins:
        theirs = self.theirs.labels(model_name=self.model_name, **labels) if self.theirs is not None else None
        return _Twins(self.ours.labels(**labels), theirs, self.model_name)

    def inc(self, amount: float = 1) -> None:
        self.ours.inc(amount)
        if self.theirs is not None:
            self.theirs.inc(amount)


class ServerMetrics:
    def __init__(self, executor, model_name: str = "specexec") -> None:
        self.executor = executor
        self.registry = registry = CollectorRegistry()

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> _Twins:
            ours = Counter(f"specexec:{name}", doc, labels, registry=registry)
            theirs = None
            if name in VLLM_TWINS:
                theirs = Counter(f"vllm:{name}", doc, ("model_name", *labels), registry=registry)
            if theirs is not None and not labels:
                theirs = theirs.labels(model_name=model_name)
            return _Twins(ours, theirs, model_name)

        self.requests = counter("request_success", "Finished requests by finish reason", ("finished_reason",))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "Output tokens of finished requests")
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache"
        )
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache")
        self.num_drafts = counter("spec_decode_num_drafts", "Verify steps that carried drafts")
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified")
        self.num_accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens the target accepted")
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted drafts by position in the draft",
            ("position",),
        )
        self.grammar_rejected = counter(
            "spec_decode_num_grammar_rejected_tokens", "Drafts rejected because the grammar forbids them"
        )
        self.target_rejected = counter(
            "spec_decode_num_target_rejected_tokens", "Drafts the grammar allows that the target rejected"
        )
        self.mask_wait = counter("grammar_mask_wait_seconds", "Time the loop waited for grammar masks")
        self.ttft = Histogram(
            "specexec:time_to_first_token_seconds",
            "Time to first token",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "specexec:time_per_output_token_seconds",
            "Time per output token after the first",
            buckets=_TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            "specexec:e2e_request_latency_seconds",
            "Arrival to finish",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.running = Gauge("specexec:num_requests_running", "Requests holding KV pages", registry=registry)
        self.waiting = Gauge("specexec:num_requests_waiting", "Requests waiting to run", registry=registry)
        self.kv_used = Gauge("specexec:kv_cache_used_pages", "KV pages in use", registry=registry)
        self.kv_total = Gauge("specexec:kv_cache_total_pages", "KV pages in the pool", registry=registry)
        vllm = {"labelnames": ("model_name",), "registry": registry}
        self.vllm_gauges = {
            "running": Gauge("vllm:num_requests_running", "Requests holding KV pages", **vllm),
            "waiting": Gauge("vllm:num_requests_waiting", "Requests waiting to run", **vllm),
            "usage": Gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means 100 percent", **vllm),
            "gpu_usage": Gauge("vllm:gpu_cache_usage_perc", "The same, under vLLM's older name", **vllm),
        }
        self.model_name = model_name

    def record(self, output: RequestOutput) -> None:
        """Count one finished request."""
        m = output.metrics
        self.requests.labels(finished_reason=str(output.finish_reason)).inc()
        self.prompt_tokens.inc(m.num_prompt_tokens)
        self.generation_tokens.inc(m.num_output_tokens)
        self.prefix_cache_queries.inc(m.num_prompt_tokens)
        self.prefix_cache_hits.inc(m.num_cached_tokens)
        if m.proposed_per_position:
            self.num_drafts.inc(m.proposed_per_position[0])
        self.num_draft_tokens.inc(m.num_draft_tokens)
        self.num_accepted.inc(m.num_accepted_tokens)
        for position, count in enumerate(m.accepted_per_position):
            self.accepted_per_pos.labels(position=str(position)).inc(count)
        self.grammar_rejected.inc(m.num_grammar_rejected_drafts)
        self.target_rejected.inc(m.num_draft_tokens - m.num_accepted_tokens - m.num_grammar_rejected_drafts)
        self.mask_wait.inc(m.mask_wait_ms / 1000)
        if m.time_to_first_token is not None:
            self.ttft.observe(m.time_to_first_token)
        if m.time_per_output_token:
            self.tpot.observe(m.time_per_output_token)
        if m.finish_time is not None:
            self.e2e.observe(max(0.0, m.finish_time - m.arrival_time))

    def render(self) -> bytes:
        """The registry in Prometheus' text format, the gauges read now."""
        waiting, running = self.executor.queue_sizes()
        self.waiting.set(waiting)
        self.running.set(running)
        bm = self.executor.block_manager
        used = bm.num_blocks - bm.num_free_blocks
        self.kv_total.set(bm.num_blocks)
        self.kv_used.set(used)
        usage = used / bm.num_blocks if bm.num_blocks else 0.0
        for key, value in (
            ("running", running),
            ("waiting", waiting),
            ("usage", usage),
            ("gpu_usage", usage),
        ):
            self.vllm_gauges[key].labels(model_name=self.model_name).set(value)
        return generate_latest(self.registry)
