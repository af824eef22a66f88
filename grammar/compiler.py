"""Asynchronous, cached grammar compilation on a small thread pool (callers never block)."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import xgrammar as xgr

from .spec import GrammarError, GrammarSpec

_LABELS = {
    "json_schema": "invalid JSON schema",
    "json_object": "cannot compile the JSON grammar",
    "regex": "invalid regex",
    "ebnf": "invalid EBNF grammar",
    "structural_tag": "invalid structural tag",
}
_LOG_PREFIX = re.compile(r"\[[\d:.]+\]\s+\S+:\d+:\s*")  # "[06:33:38] /project/cpp/x.cc:83: "
_CHECK_FAILED = re.compile(r"Check failed: \(.*?\) is false:\s*")


def _clean(exc: BaseException) -> str:
    msg = _CHECK_FAILED.sub("", _LOG_PREFIX.sub("", str(exc))).strip()
    return msg or type(exc).__name__


class GrammarCompilerPool:
    """One shared xgrammar compiler; compiled grammars cached by (kind, text) as shared futures.

    Failed compiles are evicted from the cache (the failing future is still shared by the
    requests that were waiting on it). The cache is unbounded.
    """

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        max_workers: int = 2,
        *,
        tokenizer_info: xgr.TokenizerInfo | None = None,
        max_json_whitespace: int | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        #: JSON schemas: longest whitespace run allowed between tokens (0 = compact JSON, None = any)
        self.max_json_whitespace = max_json_whitespace
        self.tokenizer_info = tokenizer_info or xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
        # Our own cache holds the results, so xgrammar's internal one would only duplicate it.
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=max_workers, cache_enabled=False
        )
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar-compile")
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], Future[xgr.CompiledGrammar]] = {}
        self.compile_times_ms: list[float] = []  # one entry per successful compile
        self.num_compiles = 0  # compile attempts (cache misses), failures included
        self.num_hits = 0

    def submit(self, spec: GrammarSpec) -> Future[xgr.CompiledGrammar]:
        """Future of the compiled grammar; its exception is a GrammarError if it does not compile."""
        key = (spec.kind, spec.text)
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None:
                self.num_hits += 1
                return fut
            fut = self._executor.submit(self._compile, spec)
            self._cache[key] = fut
            self.num_compiles += 1
        fut.add_done_callback(lambda f: self._evict_if_cancelled(key, f))
        return fut

    def get(self, spec: GrammarSpec, timeout: float | None = None) -> xgr.CompiledGrammar:
        """Blocking convenience wrapper around submit()."""
        return self.submit(spec).result(timeout)

    def cached(self, spec: GrammarSpec) -> bool:
        with self._lock:
            return (spec.kind, spec.text) in self._cache

    def compile_time_percentiles(self) -> dict[str, float]:
        """{"count", "p50_ms", "p99_ms"} over successful compiles (nearest-rank)."""
        with self._lock:
            times = sorted(self.compile_times_ms)
        if not times:
            return {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0}

        def pct(q: float) -> float:
            return times[max(0, math.ceil(q * len(times)) - 1)]

        return {"count": len(times), "p50_ms": pct(0.50), "p99_ms": pct(0.99)}

    def shutdown(self, wait: bool = True) -> None:
        """Stop the pool; queued compiles are cancelled."""
        self._executor.shutdown(wait=wait, cancel_futures=True)

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        t0 = time.perf_counter()
        try:
            compiled = self._dispatch(spec)
        except Exception as exc:
            with self._lock:  # failures are not cached; before the future completes, so no race
                self._cache.pop((spec.kind, spec.text), None)
            raise GrammarError(f"{_LABELS[spec.kind]}: {_clean(exc)}") from exc
        ms = (time.perf_counter() - t0) * 1e3
        with self._lock:
            self.compile_times_ms.append(ms)
        return compiled

    def _dispatch(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        c = self._compiler
        if spec.kind == "json_schema":
            if self.max_json_whitespace == 0:
                return c.compile_json_schema(spec.text, any_whitespace=False)
            return c.compile_json_schema(spec.text, max_whitespace_cnt=self.max_json_whitespace)
        if spec.kind == "json_object":
            return c.compile_builtin_json_grammar()
        if spec.kind == "regex":
            return c.compile_regex(spec.text)
        if spec.kind == "ebnf":
            return c.compile_grammar(spec.text)
        return c.compile_structural_tag(spec.text)

    def _evict_if_cancelled(self, key: tuple[str, str], fut: Future) -> None:
        if fut.cancelled():  # shutdown() dropped it before it ran
            with self._lock:
                if self._cache.get(key) is fut:
                    del self._cache[key]
