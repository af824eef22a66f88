"""Asynchronous, cached grammar compilation on a small thread pool (callers never block)."""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import xgrammar as xgr

from .spec import GrammarError, GrammarSpec, choice_ebnf

_LABELS = {
    "json_schema": "invalid JSON schema",
    "json_object": "cannot compile the JSON grammar",
    "regex": "invalid regex",
    "ebnf": "invalid EBNF grammar",
    "choice": "cannot compile the choices",
    "structural_tag": "invalid structural tag",
}
_LOG_PREFIX = re.compile(r"\[[\d:.]+\]\s+\S+:\d+:\s*")  # "[06:33:38] /project/cpp/x.cc:83: "
_CHECK_FAILED = re.compile(r"Check failed: \(.*?\) is false:\s*")

JSON_OBJECT_SCHEMA = '{"type": "object"}'  #: what json_object compiles to: any JSON object


def hf_tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: Sequence[int]) -> xgr.TokenizerInfo:
    """xgrammar's view of the vocabulary. A model without EOS gives no stop tokens: xgrammar then looks
    for some itself (its warning that it does is expected here), and the executor's matchers end when
    the grammar is complete instead of on a stop token."""
    if stop_token_ids:
        return xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids)
        )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*stop_token_ids is neither provided.*")
        return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)


def _clean(exc: BaseException) -> str:
    msg = _CHECK_FAILED.sub("", _LOG_PREFIX.sub("", str(exc))).strip()
    return msg or type(exc).__name__


class CompileWorkers:
    """Daemon threads that run compile jobs. A job that overruns its deadline can be abandoned: a new
    thread takes its place, and the stuck one (xgrammar's C++ cannot be interrupted) exits when, if
    ever, its job returns; daemon threads never hold up the interpreter's exit."""

    def __init__(self, num_workers: int) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._abandoned: set[Future] = set()
        self._num_workers = 0
        self._is_shut_down = False
        for _ in range(num_workers):
            self._spawn()

    def submit(self, fn: Callable, *args) -> Future:
        if self._is_shut_down:
            raise RuntimeError("cannot compile: the grammar compiler pool is shut down")
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def abandon(self, future: Future) -> None:
        """Give up on a running job: its thread is replaced (queued jobs are unaffected)."""
        with self._lock:
            if future.running() and future not in self._abandoned:
                self._abandoned.add(future)
                self._spawn()

    def shutdown(self) -> None:
        """Cancel queued jobs and let every worker exit."""
        with self._lock:
            self._is_shut_down = True
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].cancel()
            for _ in range(self._num_workers):
                self._jobs.put(None)

    def _spawn(self) -> None:
        self._num_workers += 1
        threading.Thread(target=self._serve, name="grammar-compile", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:
                    future.set_exception(exc)
            del job, fn, args  # hold nothing of the pool's while idle
            with self._lock:
                if future in self._abandoned:  # a replacement took this thread's place
                    self._abandoned.discard(future)
                    self._num_workers -= 1
                    return
            del future
        with self._lock:
            self._num_workers -= 1


class GrammarCompilerPool:
    """One shared xgrammar compiler; compiled grammars cached by (kind, text) as shared futures.

    Failed compiles are evicted from the cache (the failing future is still shared by the
    requests that were waiting on it). The cache keeps the ``max_cached`` grammars used last.
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
        max_cached: int = 512,
    ) -> None:
        self.vocab_size = vocab_size
        self.max_cached = max_cached
        #: JSON schemas: longest whitespace run allowed between tokens (0 = compact JSON, None = any)
        self.max_json_whitespace = max_json_whitespace
        self.tokenizer_info = tokenizer_info or hf_tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        #: each token's bytes as xgrammar reads them (grammar-forced drafts compare them)
        self.vocab_bytes: list[bytes] = self.tokenizer_info.decoded_vocab
        # Our own cache holds the results, so xgrammar's internal one would only duplicate it.
        self._compiler = xgr.GrammarCompiler(
            self.tokenizer_info, max_threads=max_workers, cache_enabled=False
        )
        self._workers = CompileWorkers(max_workers)
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], Future[xgr.CompiledGrammar]] = OrderedDict()
        self.compile_times_ms: deque[float] = deque(maxlen=10_000)  # the latest successful compiles
        self.num_compiles = 0  # compile attempts (cache misses), failures included
        self.num_hits = 0

    def submit(self, spec: GrammarSpec) -> Future[xgr.CompiledGrammar]:
        """Future of the compiled grammar; its exception is a GrammarError if it does not compile."""
        key = (spec.kind, spec.text)
        with self._lock:
            fut = self._cache.get(key)
            if fut is not None:
                self.num_hits += 1
                self._cache.move_to_end(key)
                return fut
            fut = self._workers.submit(self._compile, spec)
            self._cache[key] = fut
            self.num_compiles += 1
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)  # (requests holding its future keep it)
        fut.add_done_callback(lambda f: self._evict_if_cancelled(key, f))
        return fut

    def get(self, spec: GrammarSpec, timeout: float | None = None) -> xgr.CompiledGrammar:
        """Blocking convenience wrapper around submit()."""
        return self.submit(spec).result(timeout)

    def warm_up(self) -> None:
        """Compile one tiny JSON schema, outside the cache and the statistics: the first compile of a
        process sets up xgrammar's own tables (start-up warm-up)."""
        self._dispatch(GrammarSpec("json_schema", '{"type": "object"}'))

    def cached(self, spec: GrammarSpec) -> bool:
        with self._lock:
            return (spec.kind, spec.text) in self._cache

    def compile_time_percentiles(self) -> dict[str, float]:
        """{"count", "p50_ms", "p99_ms"} over successful compiles (numpy's percentile, as the benchmark's)."""
        import numpy as np

        with self._lock:
            times = list(self.compile_times_ms)
        if not times:
            return {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0}
        p50, p99 = np.percentile(times, [50, 99])
        return {"count": len(times), "p50_ms": float(p50), "p99_ms": float(p99)}

    def abandon(self, future: Future) -> None:
        """A compile overran its deadline: free its worker slot (the future stays unfinished and
        cached, so later requests for the same grammar wait for it instead of starting another)."""
        self._workers.abandon(future)

    def shutdown(self) -> None:
        """Stop the pool; queued compiles are cancelled."""
        self._workers.shutdown()

    def __del__(self) -> None:
        # at interpreter exit the modules' globals (queue's, contextlib's) may be gone before this runs:
        # then there is nothing left to stop, and no noise to print about it
        try:  # noqa: SIM105
            self._workers.shutdown()  # its threads hold only the workers' queue
        except Exception:
            pass

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
        if spec.kind in ("json_schema", "json_object"):
            # json_object is OpenAI's JSON mode: an object, not any JSON value (xgrammar's builtin JSON
            # grammar also allows arrays, strings and numbers at the top)
            schema = spec.text if spec.kind == "json_schema" else JSON_OBJECT_SCHEMA
            if self.max_json_whitespace == 0:
                return c.compile_json_schema(schema, any_whitespace=False)
            return c.compile_json_schema(schema, max_whitespace_cnt=self.max_json_whitespace)
        if spec.kind == "regex":
            return c.compile_regex(spec.text)
        if spec.kind == "ebnf":
            return c.compile_grammar(spec.text)
        if spec.kind == "choice":
            return c.compile_grammar(choice_ebnf(json.loads(spec.text)))
        return c.compile_structural_tag(spec.text)

    def _evict_if_cancelled(self, key: tuple[str, str], fut: Future) -> None:
        if fut.cancelled():  # shutdown() dropped it before it ran
            with self._lock:
                if self._cache.get(key) is fut:
                    del self._cache[key]
