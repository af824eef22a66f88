"""Runs the configured engines over the workload, one after the other in one process."""

from __future__ import annotations

import gc
import logging

import torch
from tqdm import tqdm

from ..prompt_sets.datasets import BenchPrompt
from .engines.conversations import num_turns, run_conversations
from .engines.hf_batch import run_hf_generate_batch
from .engines.specexec_hf import (
    Workload,
    chat_token_ids,
    hf_grammar_processors,
    run_hf_generate,
    run_specexec,
)
from .held_messages import library_messages_after_the_bar
from .records import summarize
from .report import add_speedups
from .workload.repeats import combine_passes
from .workload.stop_tokens import FORBIDDEN_BY, StopTokens, find_stop_tokens

logger = logging.getLogger("specexec")
FORWARD_COST_REPEATS = 3  #: timed forwards per size (after one untimed); the median is kept
RETOKENIZE_SLACK = 16  #: tokens a conversation's turn may grow by when its answer's text is tokenized again


class BenchRunner:
    def __init__(self, args, configs, prompts, concurrencies: list[int], baselines: list[str]) -> None:
        self.args = args
        self.configs = configs
        self.prompts = prompts
        self.concurrencies = concurrencies
        self.baselines = baselines
        self.rows: list[dict] = []
        self.forward_cost: dict | None = None  #: target forward time over n tokens, relative to n = 1
        self._models: dict[tuple, object] = {}
        self.dtypes: dict[str, str] = {}  #: each dtype asked for -> what ran, and why ("auto" resolved)
        self._tokenizer = None
        self.stop_tokens: StopTokens | None = None  #: the one stop set, from the first model loaded
        self.num_passes = max(1, getattr(args, "repeats", 1))  #: every configuration this many times
        self._pass = 0  #: the pass running now (rows carry it)
        self._cached: dict[str, object] = {}  #: what later passes reuse: HF's copy, its assistant, llama
        #: conversations (each prompt's later turns sent after its answers) instead of single prompts
        self.multiturn = any(p.follow_ups for p in prompts)

    # ---- models ---------------------------------------------------------------------------------
    def _load(self, model: str | None, dtype: str, *, fresh: bool = False):
        """The target, loaded once per (path, dtype); ``fresh`` gives an extra copy for HF."""
        from ..executor.model.model_loader import load_model

        dtype = self._resolve(model, dtype)
        key = (model, dtype)
        if fresh or key not in self._models:
            loaded = load_model(model, dtype=dtype, progress=False)
            self._remember_tokenizer(loaded)
            if fresh:
                return loaded.model
            self._models[key] = loaded.model
        return self._models[key]

    def _remember_tokenizer(self, loaded) -> None:
        """The first model's tokenizer renders every prompt, and its stop ids (tokenizer, generation
        config, GGUF file) make the one stop set every engine gets."""
        if self._tokenizer is None:
            self._tokenizer = loaded.tokenizer
            self.stop_tokens = find_stop_tokens(
                loaded.tokenizer, loaded.model.generation_config, loaded.gguf_path
            )

    def _workload(self) -> Workload:
        tok = self._tokenizer
        ids = chat_token_ids(tok, self.prompts)
        a = self.args
        tools = bool(getattr(a, "tool_choice", None))
        stops = self.stop_tokens.token_ids if self.stop_tokens else []
        return Workload(
            self.prompts, ids, a.max_tokens, a.temperature, a.ignore_eos, a.guided, tools, list(stops)
        )

    def _summarize(self, name: str, concurrency: int, records, wall: float, extra: dict, engine: str) -> None:
        """One row of this pass, saying how its engine kept the stop set out with --ignore-eos."""
        row = summarize(name, concurrency, records, wall, extra)
        row["pass"] = self._pass
        row["stop_tokens_forbidden_by"] = FORBIDDEN_BY[engine] if self.args.ignore_eos else None
        self.rows.append(row)

    def _prompt_lookup_lengths(self) -> list[int]:
        return [int(n) for n in str(self.args.hf_prompt_lookup_tokens).split(",") if n]

    def _num_runs(self) -> int:
        hf = 0
        if "hf" in self.baselines and self.args.guided:
            hf = 1 if 1 in self.concurrencies else 0
        elif "hf" in self.baselines:
            single = 2 + len(self._prompt_lookup_lengths())
            hf = (single if 1 in self.concurrencies else 0) + sum(c > 1 for c in self.concurrencies)
        llamacpp = int("llamacpp" in self.baselines and 1 in self.concurrencies)
        server = len(self.concurrencies) if self.args.server else 0
        if "llama-server" in self.baselines:
            server += len(self.concurrencies) * len(self._llama_server_args())
        if self.multiturn:  # (specexec's configurations and servers)
            per_pass = (len(self.configs) * len(self.concurrencies) + server) * num_turns(self.prompts)
        else:
            per_pass = (len(self.configs) * len(self.concurrencies) + hf + llamacpp + server) * len(
                self.prompts
            )
        return per_pass * self.num_passes

    def _resolve(self, model: str | None, dtype: str, quantization: str | None = None) -> str:
        """``auto`` becomes this machine's pick (the executor's own rule, for weights quantized as
        ``quantization``), so HF runs the same dtype."""
        if dtype != "auto":
            return dtype
        from ..executor.config import ExecutorConfig
        from ..executor.engine_setup import resolve_dtype

        base = self.configs[0].config
        config = ExecutorConfig(
            model=model, device=base.device, cache_dir=base.cache_dir, quantization=quantization
        )
        choice = resolve_dtype(model, config)
        self.dtypes["auto" + (f" ({quantization})" if quantization else "")] = (
            f"{choice.dtype} ({choice.reason})"
        )
        return choice.dtype

    # ---- running --------------------------------------------------------------------------------
    def run_all(self) -> None:
        """Every configuration once per pass, the passes one after the other (A, B, C, A, B, C, ...), so
        a slow spell of the machine falls on every configuration alike instead of on one."""
        with (
            library_messages_after_the_bar(),
            tqdm(total=self._num_runs(), desc="bench", unit="req", dynamic_ncols=True) as bar,
        ):
            for i in range(self.num_passes):
                self._pass = i
                for named in self.configs:
                    self._run_specexec(named, bar)
                if "hf" in self.baselines:
                    self._run_hf(bar)
                if "llamacpp" in self.baselines:
                    self._run_llamacpp(bar)
                if "llama-server" in self.baselines:
                    for extra_args in self._llama_server_args():
                        self._run_llama_server(extra_args, bar)
                if self.args.server:
                    self._run_server(bar)

    def _run_specexec(self, named, bar) -> None:
        from ..executor.executor import Executor

        cfg = named.config
        # a quantizing executor loads its own copy (it replaces layers, and gguf reads the file again)
        model = None if cfg.quantization else self._load(cfg.model, cfg.dtype)
        if self._tokenizer is None:
            self._load(cfg.model, cfg.dtype)  # the workload is tokenized with the model's tokenizer
        executor = Executor(model, cfg, tokenizer=self._tokenizer)
        if cfg.quantization and cfg.dtype == "auto":
            self.dtypes[f"auto ({named.name})"] = (
                f"{executor.setup.dtype_choice.dtype} ({executor.setup.dtype_choice.reason})"
            )
        work = self._workload()
        run = run_conversations if self.multiturn else run_specexec
        self._warm_up(lambda w: run(executor, w, 1))
        if self.forward_cost is None:
            self._measure_forward_cost(executor)
        for c in self.concurrencies:
            bar.set_postfix_str(f"{named.name} c={c}{self._pass_label()}")
            executor.reset_prefix_cache()  # every run starts cold: nothing reused from the one before
            executor.forget_finished_requests()  # (Suffix's outputs of the same prompts in an earlier pass)
            stats = executor.speculation.stats
            draft0, target0 = stats.drafting_time, stats.target_time
            broadcast0 = executor.broadcast_seconds
            records, wall = run(executor, work, c, bar.update)
            drafting, target = stats.drafting_time - draft0, stats.target_time - target0
            broadcast = executor.broadcast_seconds - broadcast0
            extra = {
                "drafting_share": drafting / (drafting + target) if drafting + target else None,
                "engine": "specexec",
                "quantization": executor.config.quantization,  # (auto resolved)
                "prefix_caching": cfg.enable_prefix_caching,
                "tensor_parallel_size": cfg.tensor_parallel_size,
                # tensor parallelism: the steps' broadcast (post to rank 0's read) over the forwards' time
                "tp_broadcast_share": broadcast / target if cfg.tensor_parallel_size > 1 and target else None,
                "guided": self.args.guided,
                "mask_wait_ms_total": sum(r.mask_wait_ms for r in records),
                "grammar_compile_ms": executor.guided.pool.compile_time_percentiles()
                if self.args.guided
                else None,
            }
            self._summarize(named.name, c, records, wall, extra, "specexec")
        executor.close()  # (its threads, and under tensor parallelism its worker processes)
        gc.collect()

    def _measure_forward_cost(self, executor) -> None:
        """How much one target forward over 1 + k tokens costs against one token (decides how far
        speculation can go), at a context of about the workload's prompt length."""
        from ..executor.kernel_plan.forward_cost import measure_forward_cost

        context = max(16, sum(len(t) for t in self._workload().token_ids) // len(self.prompts))
        cost = measure_forward_cost(
            lambda n: executor.time_forward(n, context),
            sizes=(1, 2, 4, 6, 8, 16),
            repeats=FORWARD_COST_REPEATS,
        )
        self.forward_cost = {
            "context_tokens": context,
            "repeats": FORWARD_COST_REPEATS,
            "num_tokens": cost.num_tokens,
            "ms": [s * 1000 for s in cost.seconds],
            "relative_to_one": [s / cost.seconds[0] for s in cost.seconds],
        }

    def _run_hf(self, bar) -> None:
        dtype = self.args.hf_dtype or self.args.dtype or self.configs[0].config.dtype
        if "hf" not in self._cached:  # its own copy, loaded once for every pass
            self._cached["hf"] = self._load(self.configs[0].config.model, dtype, fresh=True)
        model = self._cached["hf"]
        tok = self._tokenizer
        work = self._workload()
        if self.args.guided:  # generate with xgrammar's processor; prompt lookup cannot be guided
            if 1 in self.concurrencies:
                processors = hf_grammar_processors(
                    model, tok, self.configs[0].config.guided_json_max_whitespace
                )
                bar.set_postfix_str("hf-guided c=1")
                self._warm_up(lambda w: run_hf_generate(model, tok, w, {}, processors=processors))
                records, wall = run_hf_generate(model, tok, work, {}, bar.update, processors)
                extra = {"engine": "transformers generate + xgrammar LogitsProcessor", "guided": True}
                self._summarize("hf-guided", 1, records, wall, extra, "transformers")
            return
        if 1 in self.concurrencies:
            from ..drafters.draft_target.quantized_copy import quantized_copy

            variants: dict[str, dict] = {"hf": {}}
            for n in self._prompt_lookup_lengths():
                variants[f"hf-prompt-lookup-{n}"] = {"prompt_lookup_num_tokens": n}
            # the same int8 copy specexec's self-draft uses, in the dtype measured for its kernels
            if "hf-assistant" not in self._cached:
                self._cached["hf-assistant"] = quantized_copy(model, dtype=self._self_draft_dtype(model))
            variants["hf-assisted"] = {"assistant_model": self._cached["hf-assistant"]}
            for name, kwargs in variants.items():
                bar.set_postfix_str(f"{name} c=1{self._pass_label()}")
                self._warm_up(lambda w, kw=kwargs: run_hf_generate(model, tok, w, kw))
                records, wall = run_hf_generate(model, tok, work, kwargs, bar.update)
                extra = {"engine": "transformers generate"}
                self._summarize(name, 1, records, wall, extra, "transformers")
        for c in (c for c in self.concurrencies if c > 1):  # (each call warms its manager up, untimed)
            bar.set_postfix_str(f"hf-batch c={c}{self._pass_label()}")
            records, wall = run_hf_generate_batch(model, tok, work, c, bar.update)
            extra = {"engine": "transformers continuous batching (generate_batch's manager)"}
            self._summarize("hf-batch", c, records, wall, extra, "transformers")

    def _run_llamacpp(self, bar) -> None:
        """The same GGUF through llama-cpp-python, at concurrency 1 only (one request at a time)."""
        from .engines.llamacpp import gguf_file, import_llama_cpp, load_llama, run_llamacpp
        from .machine import torch_threads

        if 1 not in self.concurrencies:
            logger.info("llamacpp runs at concurrency 1 only; not in --concurrency")
            return
        if self._tokenizer is None:
            self._load(self.configs[0].config.model, self.configs[0].config.dtype)
        llama_cpp = import_llama_cpp()
        work = self._workload()
        if "llamacpp" not in self._cached:
            path = gguf_file(self.configs[0].config.model)
            self._cached["llamacpp"] = load_llama(llama_cpp, path, work, torch_threads())
        llm = self._cached["llamacpp"]
        bar.set_postfix_str(f"llamacpp c=1{self._pass_label()}")
        self._warm_up(lambda w: run_llamacpp(llama_cpp, llm, self._tokenizer, w))
        records, wall = run_llamacpp(llama_cpp, llm, self._tokenizer, work, bar.update)
        extra = {"engine": f"llama-cpp-python {llama_cpp.__version__}", "guided": self.args.guided}
        self._summarize("llamacpp", 1, records, wall, extra, "llama.cpp")

    def _run_server(self, bar) -> None:
        """A running server driven over HTTP with the same token ids, at every concurrency."""
        from .engines.server import ServerTarget, check_server, run_server

        url, key = self.args.server, self.args.api_key
        served = check_server(url)
        if self._tokenizer is None:  # the workload is rendered with the model's own chat template
            from ..executor.model.model_loader import load_model

            self._remember_tokenizer(load_model(self.args.model, progress=False))
        work = self._workload()
        texts = None
        if self.args.server_prompts == "text":
            texts = [self._tokenizer.decode(ids) for ids in work.token_ids]
        target = ServerTarget(url, served, key, texts)
        # how the server names each stop token in log-probabilities: its decoding alone
        stop_texts = frozenset(self._tokenizer.decode([t]) for t in work.stop_token_ids)
        self._warm_up(
            lambda w: run_server(ServerTarget(url, served, key, texts and texts[: len(w.prompts)]), w, 1)
        )
        self._drive_server("server", target, work, f"server {url} ({served})", "server", bar, stop_texts)

    def _drive_server(
        self, name, target, work, engine: str, forbidden_by: str, bar, stop_texts=frozenset(), exit_note=None
    ):
        """A served engine's rows, one a concurrency, its acceptance rate from the server's counters.
        ``exit_note``: for a server the bench started, what it left if it died (its requests then fail,
        each with the error the client saw, and so do the rows after; the bench goes on)."""
        from .engines.server import run_server
        from .engines.server_conversations import run_server_conversations

        decode = self._tokenizer.decode if target.prompt_texts is not None else None
        died = None
        for c in self.concurrencies:
            bar.set_postfix_str(f"{name} c={c}{self._pass_label()}")
            if self.multiturn:
                records, wall, counters = run_server_conversations(
                    target, work, c, self._render, decode, bar.update, stop_texts
                )
            else:
                records, wall, counters = run_server(target, work, c, bar.update, stop_texts=stop_texts)
            if died is None and exit_note is not None and (died := exit_note()) is not None:
                logger.error(
                    "%s died at c=%d%s; its requests from then on fail: %s", name, c, self._pass_label(), died
                )
            drafted, accepted = counters.get("num_draft_tokens", 0), counters.get("num_accepted_tokens", 0)
            extra = {
                "engine": engine,
                "guided": self.args.guided,
                "acceptance_rate": accepted / drafted if drafted else None,
            }
            self._summarize(name, c, records, wall, extra, forbidden_by)

    def _render(self, messages: list[dict]) -> list[int]:
        """A conversation so far as the chat template's token ids, ready for generation."""
        return chat_token_ids(self._tokenizer, [BenchPrompt("", messages)])[0]

    def _longest_request(self, work) -> int:
        """Tokens the longest request holds, prompt and output: in conversations the last turn's, its
        prompt every turn before it with an answer of max tokens each (re-tokenized: a slack a turn)."""
        if not self.multiturn:
            return max(len(ids) for ids in work.token_ids) + work.max_tokens
        longest = 0
        for prompt in work.prompts:
            history = list(prompt.messages)
            for follow_up in prompt.follow_ups:
                history += [{"role": "assistant", "content": ""}, {"role": "user", "content": follow_up}]
            turns = 1 + len(prompt.follow_ups)
            longest = max(longest, len(self._render(history)) + turns * (work.max_tokens + RETOKENIZE_SLACK))
        return longest

    def _llama_server_args(self) -> list[str]:
        return self.args.llama_server_args or [""]

    def _run_llama_server(self, extra_args: str, bar) -> None:
        """llama.cpp's server on the same GGUF and threads, started for this pass and stopped after it,
        driven like --server at every concurrency (`engines/llama_server.py`)."""
        from .engines.llama_server import LlamaServer, find_llama_server, row_name
        from .engines.llamacpp import gguf_file
        from .engines.server import ServerTarget, check_server, run_server
        from .machine import torch_threads

        if self._tokenizer is None:
            self._load(self.configs[0].config.model, self.configs[0].config.dtype)
        work = self._workload()
        name = row_name(extra_args)
        slot_context = self._longest_request(work)
        server = LlamaServer(
            find_llama_server(self.args.llama_server),
            gguf_file(self.args.model or self.configs[0].config.model),
            threads=torch_threads(),
            slots=max(self.concurrencies),
            slot_context=slot_context,
            extra_args=extra_args,
        )
        with server:
            served = check_server(server.url)
            target = ServerTarget(server.url, served, dialect="llama-server")
            self._warm_up(lambda w: run_server(target, w, 1))
            engine = f"llama-server ({' '.join(server.argv[1:])})"
            self._drive_server(name, target, work, engine, "llama-server", bar, exit_note=server.exit_note)

    def _self_draft_dtype(self, model) -> torch.dtype:
        from ..drafters.base import DrafterContext
        from ..drafters.draft_target.self_draft import self_draft_dtype

        context = DrafterContext(model, self._tokenizer, 0, self.configs[0].config)
        return getattr(torch, self_draft_dtype(context, "int8"))

    def _warm_up(self, fn) -> None:
        if self.args.warmup <= 0:
            return
        work = self._workload()
        work.prompts, work.token_ids = work.prompts[: self.args.warmup], work.token_ids[: self.args.warmup]
        work.max_tokens = min(work.max_tokens, 8)
        fn(work)

    def _pass_label(self) -> str:
        return f" pass {self._pass + 1}/{self.num_passes}" if self.num_passes > 1 else ""

    def finish(self) -> list[dict]:
        """The rows with their speed-ups, each pass's against the baselines of the same pass; with
        --repeats, one row per (name, concurrency): the median of its passes, their spread and each pass."""
        hf = "hf-guided" if self.args.guided else "hf"
        baselines = {c: {"none": "none", "hf": hf if c == 1 else "hf-batch"} for c in self.concurrencies}
        for i in range(self.num_passes):
            add_speedups([r for r in self.rows if r["pass"] == i], baselines)
        return combine_passes(self.rows) if self.num_passes > 1 else self.rows
