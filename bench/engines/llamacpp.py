"""llama.cpp as a baseline (``--baseline llamacpp``): the same GGUF file through llama-cpp-python.

Like with like: the prompts are the same token ids the other engines get (the model's chat template,
rendered by the HF tokenizer; llama.cpp reads the same vocabulary from the file), the same number of
threads as torch, greedy (top-k 1, no penalties; with ``--temperature`` > 0, sampling from the whole
distribution seeded per request, as the other engines do), the same max tokens and stop set (stopping on
any of it, or with ``--ignore-eos`` every one of it forbidden), and with ``--guided`` each prompt's JSON schema as a llama.cpp grammar (the binding's own JSON-schema
converter). One request at a time (concurrency 1). llama-cpp-python is never a dependency of the
project or its tests; it is imported only when asked for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from ..records import RequestRecord, schema_valid
from ..workload.stop_tokens import num_stop_tokens
from .specexec_hf import Workload, _failed_record

INSTALL = (
    "pip install llama-cpp-python (built from source: minutes on 2 cores; see the README's llama.cpp section)"
)
CONTEXT_SLACK = 64  #: tokens of context beyond the longest prompt + max tokens


def import_llama_cpp():
    """The ``llama_cpp`` module, or a ValueError with the install command (also when the package is there
    but its shared library is not: a build that failed half-way raises FileNotFoundError on import)."""
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:
        raise ValueError(f"--baseline llamacpp needs a working llama-cpp-python ({exc}): {INSTALL}") from exc
    return llama_cpp


def gguf_file(model: str | None) -> Path:
    """The GGUF file llama.cpp runs: ``--model`` when it is one, else the embedded SmolLM2's."""
    if model is None:
        from ...executor.model.model_loader import default_model_path

        return default_model_path()
    path = Path(model).expanduser()
    if path.is_dir():
        raise ValueError(f"--baseline llamacpp runs a GGUF file; --model {model} is a Hugging Face directory")
    return path


def load_llama(llama_cpp, path: Path, work: Workload, num_threads: int):
    context = max(len(ids) for ids in work.token_ids) + work.max_tokens + CONTEXT_SLACK
    return llama_cpp.Llama(
        model_path=str(path),
        n_threads=num_threads,
        n_threads_batch=num_threads,
        n_ctx=context,
        n_batch=min(context, 2048),
        seed=0,
        verbose=False,
    )


def run_llamacpp(
    llama_cpp, llm, tokenizer, work: Workload, on_done: Callable[[], None] = lambda: None
) -> tuple[list[RequestRecord], float]:
    """Greedy generation, one request at a time; records in prompt order. The GGUF's own EOS must be in
    the workload's stop set (it is, when the set was read from the same file)."""
    if llm.token_eos() not in work.stop_token_ids:
        raise ValueError(
            f"llama.cpp's EOS id {llm.token_eos()} is not in the bench's stop set {work.stop_token_ids}"
        )
    records = []
    start_all = time.perf_counter()
    for i, (prompt, ids) in enumerate(zip(work.prompts, work.token_ids)):
        grammar = None
        if work.guided and prompt.schema:
            try:
                grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(prompt.schema), verbose=False)
            except Exception as exc:  # a schema the converter cannot take: this request fails
                records.append(_failed_record(prompt, ids, f"{type(exc).__name__}: {exc}"))
                on_done()
                continue
        llm.set_seed(i)  # the seed the other engines give request i (matters only when sampling)
        records.append(_generate_one(llama_cpp, llm, tokenizer, prompt, ids, work, grammar))
        on_done()
    return records, time.perf_counter() - start_all


def _generate_one(llama_cpp, llm, tokenizer, prompt, ids, work: Workload, grammar) -> RequestRecord:
    stops = set(work.stop_token_ids)
    processors = None
    if work.ignore_eos:

        def forbid_stop_tokens(_input_ids, scores):
            for token in stops:
                scores[token] = -float("inf")
            return scores

        processors = llama_cpp.LogitsProcessorList([forbid_stop_tokens])
    out: list[int] = []
    first = None
    llm.reset()  # no prefix reuse from the previous prompt: the other engines do not reuse one either
    start = time.perf_counter()
    greedy = work.temperature <= 0
    tokens = llm.generate(
        ids,
        top_k=1 if greedy else 0,  # llama.cpp's top-k 0 keeps every token, like HF's top_k=0
        top_p=1.0,
        min_p=0.0,
        typical_p=1.0,
        temp=0.0 if greedy else work.temperature,
        repeat_penalty=1.0,
        reset=True,
        logits_processor=processors,
        grammar=grammar,
    )
    for token in tokens:
        if first is None:
            first = time.perf_counter()
        out.append(int(token))
        if (token in stops and not work.ignore_eos) or len(out) >= work.max_tokens:
            break
    end = time.perf_counter()
    text = tokenizer.decode(out, skip_special_tokens=True)
    return RequestRecord(
        id=prompt.id,
        num_prompt_tokens=len(ids),
        num_output_tokens=len(out),
        latency_ms=(end - start) * 1000,
        ttft_ms=None if first is None else (first - start) * 1000,
        tpot_ms=(end - first) * 1000 / (len(out) - 1) if first is not None and len(out) > 1 else None,
        finish_reason="stop" if not work.ignore_eos and out and out[-1] in stops else "length",
        schema_valid=schema_valid(text, prompt.schema),
        text=text,
        num_stop_tokens=num_stop_tokens(out, work.stop_token_ids),
    )
