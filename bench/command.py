"""`specexec bench`: every configuration and baseline on the same prompts, in one process.

    specexec bench --dataset extraction --num-requests 8 --concurrency 1,4 \\
        --config ngram.yaml --config self_draft.yaml --baseline none,hf --output r.json --plot r.png

A ``--config`` file holds executor keys (``speculative_config:`` as in trtllm-bench's extra options)
and an optional ``name``; or ``configs:``, a list of such blocks sharing the file's other keys.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from ..executor.layers.quantized.auto_scheme import QUANTIZATION_SETTINGS
from .machine import describe_machine, torch_threads

logger = logging.getLogger("specexec")
BASELINES = ("none", "hf", "llamacpp", "llama-server")


@dataclass(slots=True)
class NamedConfig:
    name: str
    config: object  #: ExecutorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", action="append", default=[], help="YAML with executor settings; repeatable"
    )
    parser.add_argument(
        "--model", help="HF directory or GGUF file (default: the embedded SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="overrides every config"
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATION_SETTINGS,
        help="overrides every config's weight-only quantization (default auto: a GGUF file at its own "
        "codes; none: dequantized)",
    )
    parser.add_argument(
        "--model-impl",
        choices=["auto", "specexec", "transformers"],
        help="overrides every config's forward: specexec's own decoder or transformers' modules",
    )
    parser.add_argument(
        "--quantized-kernel",
        choices=["auto", "torch", "int8_dot"],
        help="overrides every config's kernel for quantized layers (torch, or int8_dot: int8 activations)",
    )
    parser.add_argument(
        "--hf-dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="the HF baselines' dtype (default: the first configuration's)",
    )
    parser.add_argument(
        "--decoding-type",
        help="add one configuration with this drafter (auto: the executor's default; NGram, DraftTarget, ...)",
    )
    parser.add_argument("--max-draft-len", type=int, default=3, help="with --decoding-type (default 3)")
    parser.add_argument(
        "--dataset",
        default="extraction",
        help="extraction, specbench[:cat], jsonschemabench:<split>, bfcl, humaneval, multiturn "
        "(--num-requests 5-turn conversations, each turn sent after the answer to the one before) or a "
        ".jsonl file (with 'prompt', or 'turns' for conversations)",
    )
    parser.add_argument(
        "--prefix-caching",
        choices=["off", "on", "both"],
        help="overrides every config's enable_prefix_caching; both: each config twice, the second "
        "named <name>+cache (each run starts with an empty cache)",
    )
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="generate exactly --max-tokens per request, the same way in every engine: no token of the run's "
        "stop set (the tokenizer's EOS, the generation config's and the GGUF's stop ids) can be sampled "
        "(their logits -inf: HF suppress_tokens, llama.cpp a logits processor, specexec and --server min_tokens); "
        "the record says so and counts the "
        "stop tokens each row sampled (the library's SamplingParams.ignore_eos samples EOS and goes on)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run every configuration N times, interleaved (A, B, C, A, B, C, ...); the table shows each "
        "figure's median and (min-max), the JSON keeps every pass",
    )
    parser.add_argument(
        "--guided",
        action="store_true",
        help="constrain each output to its prompt's JSON schema (the hf baseline becomes hf-guided: "
        "generate with xgrammar's transformers logits processor; prompt lookup cannot be guided)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        help="comma-separated, e.g. 1,3: each config at each size (named <name>-tpN above 1; CPU, gloo)",
    )
    parser.add_argument(
        "--tool-choice",
        choices=["required"],
        help="send each prompt with its tools (bfcl) and tool_choice required, as the server would: "
        "the output is held to the calls' schema and valid is the share of answers whose calls all "
        "validate (implies --guided; specexec's configurations only)",
    )
    parser.add_argument("--concurrency", default="1", help="comma-separated, e.g. 1,2,4,8")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up requests per engine (not timed)")
    parser.add_argument(
        "--baseline",
        default=None,
        help="comma-separated: none (specexec without drafts), hf, llamacpp (the same GGUF through "
        "llama-cpp-python, at concurrency 1), llama-server (llama.cpp's server on the same GGUF and threads, "
        "started and stopped by the bench, at every concurrency); default none, or nothing with --server alone",
    )
    parser.add_argument(
        "--llama-server",
        help="with --baseline llama-server: its binary (default: $LLAMA_SERVER, else llama-server on the PATH)",
    )
    parser.add_argument(
        "--llama-server-args",
        action="append",
        help="with --baseline llama-server: more arguments for one server, e.g. '--spec-type ngram-mod' "
        "(llama.cpp's speculation); repeatable, one server and one row each (give '' for the plain one too); "
        "default: the plain server alone",
    )
    parser.add_argument(
        "--server",
        help="also drive a running OpenAI-compatible server (e.g. `specexec serve`) at this URL with the "
        "same prompts and concurrencies; TTFT and TPOT measured at the client",
    )
    parser.add_argument("--api-key", help="with --server: sent as 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--server-prompts",
        choices=("ids", "text"),
        default="ids",
        help="with --server: send each rendered prompt as its token ids (default: every engine gets the "
        "same ids) or as their text, decoded, for a server or router that takes text only (sglang-router)",
    )
    parser.add_argument(
        "--hf-prompt-lookup-tokens",
        default="3,10",
        help="comma-separated HF prompt lookup draft lengths, one hf-prompt-lookup-N row each",
    )
    parser.add_argument("--output", help="write every number to this JSON file")
    parser.add_argument("--plot", help="write the plots to this PNG file")


def _parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} takes integers >= 1, got {text!r}")
    return values


def load_configs(args) -> list[NamedConfig]:
    """Every configuration to run, validated before any model is loaded."""
    import yaml

    from ..executor.config import ExecutorConfig

    configs: list[NamedConfig] = []
    for path in args.config:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ValueError(f"cannot read config {path!r}: {exc.strerror}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"config {path!r} must be a mapping")
        blocks = data.pop("configs", None) or [{}]
        for i, block in enumerate(blocks):
            merged = {**data, **block}
            name = merged.pop("name", None) or (
                Path(path).stem if len(blocks) == 1 else f"{Path(path).stem}-{i}"
            )
            configs.append(NamedConfig(str(name), ExecutorConfig.from_dict(merged)))
    if args.decoding_type == "auto":  # the executor's default drafter (`executor/auto_defaults.py`)
        configs.append(NamedConfig("auto", ExecutorConfig(speculative_config="auto")))
    elif args.decoding_type:
        spec = {"decoding_type": args.decoding_type, "max_draft_len": args.max_draft_len}
        name = f"{args.decoding_type.lower()}-k{args.max_draft_len}"
        configs.append(NamedConfig(name, ExecutorConfig(speculative_config=spec)))
    baselines = chosen_baselines(args)
    for b in baselines:
        if b not in BASELINES:
            raise ValueError(f"--baseline {b!r}: choose from {', '.join(BASELINES)}")
    if "llamacpp" in baselines:  # before any model loads: the binding and a GGUF file
        from .engines.llamacpp import gguf_file, import_llama_cpp

        import_llama_cpp()
        gguf_file(args.model or (configs[0].config.model if configs else None))
    if "llama-server" in baselines:  # before any model loads: the binary and a GGUF file
        from .engines.llama_server import find_llama_server
        from .engines.llamacpp import gguf_file

        find_llama_server(args.llama_server)
        gguf_file(args.model or (configs[0].config.model if configs else None))
    elif args.llama_server or args.llama_server_args:
        raise ValueError("--llama-server and --llama-server-args go with --baseline llama-server")
    if "none" in baselines or not (configs or args.server):
        base = copy.deepcopy(configs[0].config) if configs else ExecutorConfig()
        base.speculative_config = None
        configs.insert(0, NamedConfig("none", base))
    for c in configs:
        if args.model:
            c.config.model = args.model
        if args.dtype:
            c.config.dtype = args.dtype
        if args.quantization:
            c.config.quantization = None if args.quantization == "none" else args.quantization
        if args.model_impl:
            c.config.model_impl = args.model_impl
        if args.quantized_kernel:
            c.config.quantized_kernel = args.quantized_kernel
    if args.prefix_caching:  # both: each config, then its ``+cache`` twin
        both = args.prefix_caching == "both"
        caching = [False, True] if both else [args.prefix_caching == "on"]
        configs = _variants(
            configs, "enable_prefix_caching", caching, lambda on: "+cache" if on and both else ""
        )
    if args.tensor_parallel_size:
        sizes = _parse_int_list(args.tensor_parallel_size, "--tensor-parallel-size")
        configs = _variants(configs, "tensor_parallel_size", sizes, lambda n: f"-tp{n}" if n > 1 else "")
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must differ: {names}")
    return configs


def _variants(configs: list[NamedConfig], key: str, values: list, suffix) -> list[NamedConfig]:
    """Every config once per value of ``key``, named ``<name><suffix(value)>``, in order."""
    out = []
    for c in configs:
        for value in values:
            config = copy.deepcopy(c.config)
            setattr(config, key, value)
            out.append(NamedConfig(c.name + suffix(value), config))
    return out


def chosen_baselines(args) -> list[str]:
    """--baseline's list; when not given: none, unless --server is the only thing to measure."""
    if args.baseline is None:
        return [] if args.server and not (args.config or args.decoding_type) else ["none"]
    return [b for b in args.baseline.split(",") if b]


def _check_drafters(configs: list[NamedConfig]) -> None:
    """Each config's drafter exists and its options are good, before any model loads."""
    from ..executor.engine.speculation.speculation_stage import choose_drafter
    from ..executor.engine.speculation.speculative_config import SpeculativeConfig
    from ..plugins import get_plugin_manager

    plugins = get_plugin_manager()
    for c in configs:
        if isinstance(c.config.speculative_config, SpeculativeConfig):  # (auto: the executor's own choice)
            choose_drafter(c.config.speculative_config, plugins)


def run(args) -> int:
    concurrencies = _parse_int_list(args.concurrency, "--concurrency")
    if args.num_requests < 1 or args.max_tokens < 1 or args.repeats < 1:
        raise ValueError("--num-requests, --max-tokens and --repeats must be >= 1")
    if args.plot:
        from .plot import check_plotting

        check_plotting()
    configs = load_configs(args)
    _check_drafters(configs)
    if args.server:  # before any model loads: is a server there?
        from .engines.server import check_server

        check_server(args.server)
    from ..prompt_sets.datasets import load_dataset

    prompts = load_dataset(args.dataset, args.num_requests)
    others = [b for b in chosen_baselines(args) if b != "none"] + (["--server"] if args.server else [])
    in_process = [b for b in others if b in ("hf", "llamacpp")]
    if any(p.follow_ups for p in prompts) and in_process:
        raise ValueError(
            f"--dataset {args.dataset} holds conversations, which specexec's configurations and servers "
            f"(--server, llama-server) run; drop {', '.join(in_process)}"
        )
    if args.tool_choice:
        if others:
            raise ValueError(f"--tool-choice runs specexec's configurations only; drop {', '.join(others)}")
        from .engines.tool_calls import tool_call_prompts

        prompts = tool_call_prompts(prompts, args.dataset)
        args.guided = True
    from .runner import BenchRunner

    runner = BenchRunner(args, configs, prompts, concurrencies, chosen_baselines(args))
    interrupted = False
    _stop_cleanly_on_signals()
    try:
        runner.run_all()
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: reporting what was measured", file=sys.stderr)
    rows = runner.finish()
    from .report import LEGEND, caching_ratios, format_table, write_json

    print(format_table(rows, guided=args.guided))
    print(LEGEND)
    for line in caching_ratios(rows):
        print(line)
    for row in rows:
        if row.get("tp_broadcast_share") is not None:
            print(
                f"tensor parallelism, {row['name']} c={row['concurrency']}: the step broadcast (post to "
                f"rank 0's read) took {row['tp_broadcast_share']:.1%} of the forwards' time"
            )
    print(f"threads: {torch_threads()} for every engine (one process); CPU: {describe_machine()['cpu']}")
    if runner.stop_tokens:
        meaning = "cannot be sampled (--ignore-eos)" if args.ignore_eos else "end a request"
        print(f"stop tokens {runner.stop_tokens.token_ids} for every engine: {meaning}")
    for asked, ran in runner.dtypes.items():
        print(f"dtype {asked}: {ran}")
    if runner.forward_cost:
        fc = runner.forward_cost
        pairs = ", ".join(f"{n}: {r:.2f}x" for n, r in zip(fc["num_tokens"], fc["relative_to_one"]))
        print(
            f"target forward over n new tokens vs one (context {fc['context_tokens']}; per size the median "
            f"of {fc['repeats']} timed forwards after one untimed: noisy on a loaded machine): {pairs}"
        )
    if args.output:
        meta = {
            "command": " ".join(["specexec", "bench", *sys.argv[2:]]),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "interrupted": interrupted,
            "dataset": args.dataset,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "repeats": args.repeats,
            **(runner.stop_tokens.record(args.ignore_eos) if runner.stop_tokens else {}),
            "machine": describe_machine(),
            "forward_cost": runner.forward_cost,
            "dtypes": runner.dtypes,
        }
        write_json(args.output, rows, meta)
        print(f"wrote {args.output}", file=sys.stderr)
    if args.plot and rows:
        from .plot import plot

        plot(args.plot, rows, _plot_title(args))
        print(f"wrote {args.plot}", file=sys.stderr)
    return 130 if interrupted else 0


def _plot_title(args) -> str:
    sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature}"
    length = f"{'exactly' if args.ignore_eos else 'up to'} {args.max_tokens} tokens"
    passes = f", median of {args.repeats} passes" if args.repeats > 1 else ""
    guided = ", guided" if args.guided else ""
    return (
        f"specexec bench: {args.dataset}, {args.num_requests} requests of {length}, {sampling}{guided}{passes}; "
        f"{torch_threads()} threads on {describe_machine()['cpu']}"
    )


def _stop_cleanly_on_signals() -> None:
    """Ctrl-C (even when started in the background, where SIGINT comes ignored) and SIGTERM stop the
    run the same way: what was measured is still reported and written."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
