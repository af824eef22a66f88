"""The `specexec` command line. Heavy imports happen inside the commands, so `--help` answers fast."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .cli_config import add_drafter_args, add_model_args, load_config


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("specexec")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specexec", description="Speculative-decoding executor for HF models."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the executor does")
    parser.add_argument("--version", action="version", version=f"specexec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="generate from one prompt, streaming the text")
    run.add_argument("--prompt", required=True, help="the prompt text ('-' reads it from standard input)")
    add_model_args(run)
    run.add_argument("--max-tokens", type=int, default=128, help="output tokens at most (default 128)")
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--top-k", type=int, default=0)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument(
        "--raw", action="store_true", help="send the prompt as plain text, not as a chat message"
    )
    run.add_argument("--system", help="system message for the chat template")
    run.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the start-up warm-up (one tiny forward of each model before the prompt runs)",
    )
    add_drafter_args(run)
    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    add_model_args(serve)
    add_drafter_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--api-key",
        action="append",
        help="require 'Authorization: Bearer KEY' (repeat for several keys; each owns its stored responses)",
    )
    serve.add_argument("--served-model-name", help="the id clients pass as model (default: the file's name)")
    serve.add_argument(
        "--max-queued-requests", type=int, default=256, help="waiting + running requests before 503"
    )
    serve.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds before a request is aborted"
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        help="larger request bodies are refused (413); default 256 per token of context, at least 8 MiB",
    )
    serve.add_argument(
        "--allow-remote-admin",
        action="store_true",
        help="without --api-key, serve /flush_cache and /reset_prefix_cache to any client (default: loopback)",
    )
    serve.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="compute every prompt in full (default: share the K/V pages of common prefixes)",
    )
    tune = sub.add_parser(
        "tune", help="measure this machine's kernel choices for a model again, store them and print them"
    )
    add_model_args(tune)
    add_drafter_args(tune)
    sub.add_parser("drafters", help="list the installed drafters (built-in and plugins) and their options")
    bench = sub.add_parser("bench", help="measure configurations and baselines side by side")
    from .bench.command import add_arguments

    add_arguments(bench)
    train = sub.add_parser(
        "train-eagle3", help="train an EAGLE-3 draft head for the target on this machine (CPU is fine)"
    )
    from .drafters.eagle3.training.command import add_arguments as add_train_arguments

    add_train_arguments(train)
    medusa = sub.add_parser(
        "train-medusa", help="train Medusa draft heads for the target on this machine (CPU is fine)"
    )
    from .drafters.medusa.training.command import add_arguments as add_medusa_arguments

    add_medusa_arguments(medusa)
    datastore = sub.add_parser(
        "build-datastore",
        help="tokenize a text corpus into a datastore for REST drafting (decoding_type REST)",
    )
    from .drafters.retrieval.datastore_command import add_arguments as add_datastore_arguments

    add_datastore_arguments(datastore)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    prompt_text = sys.stdin.read() if args.prompt == "-" else args.prompt
    from .sampling import SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    params.validate()
    config = load_config(args)
    if (code := _serve_as_worker_rank(config)) is not None:
        return code
    config.warmup = not args.no_warmup  # the first request then pays no cold start: ttft= is its own
    from .executor.executor import Executor
    from .executor.kernel_plan.measurement.journal import measurement_notes
    from .executor.plan_report import measurement_table, plan_lines

    first_note = len(measurement_notes())
    with Executor(config=config) as executor:
        for line in plan_lines(executor):
            print(f"[{line}]", file=sys.stderr)
        if args.verbose:
            print(measurement_table(measurement_notes(first_note)), file=sys.stderr)
        prompt = prompt_text
        if not args.raw and getattr(executor.tokenizer, "chat_template", None):
            prompt = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": prompt_text}
            ]
        output = None
        for event in executor.stream([prompt], params):
            sys.stdout.write(event.text)
            sys.stdout.flush()
            output = event.output or output
    sys.stdout.write("\n")
    if output is None:
        return 1
    if output.error:
        print(f"error: {output.error}", file=sys.stderr)
        return 1
    _print_metrics(output)
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    """Measure every choice of the start again for this model and config, store it, print it."""
    config = load_config(args)
    config.warmup = False
    from .executor.executor import Executor
    from .executor.kernel_plan.measurement.journal import measurement_notes, remeasuring
    from .executor.plan_report import measurement_table, plan_lines

    first_note = len(measurement_notes())
    with remeasuring(), Executor(config=config) as executor:
        print(measurement_table(measurement_notes(first_note)))
        print("\n".join(plan_lines(executor)))
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        from .server.app import ServerLimits
        from .server.serve import serve
    except ImportError as exc:
        raise ValueError(
            f"specexec serve needs the serve extra: pip install 'specexec[serve]' ({exc})"
        ) from exc
    if args.max_queued_requests < 1 or args.request_timeout <= 0:
        raise ValueError("--max-queued-requests must be >= 1 and --request-timeout > 0")
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        raise ValueError("--max-body-bytes must be >= 1")
    limits = ServerLimits(
        max_queued_requests=args.max_queued_requests,
        request_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
    )
    config = load_config(args)
    if (code := _serve_as_worker_rank(config)) is not None:
        return code
    config.enable_prefix_caching = not args.no_prefix_caching  # (on by default in serve, as vLLM's)
    serve(
        config,
        args.host,
        args.port,
        args.api_key,
        limits,
        args.served_model_name,
        allow_remote_admin=args.allow_remote_admin,
    )
    return 0


def _serve_as_worker_rank(config) -> int | None:
    """Under torchrun (``--tensor-parallel-launch torchrun``), every rank but 0 holds its shard and runs
    rank 0's steps until rank 0 stops (exit code 0) or is gone (1); None on rank 0 and elsewhere."""
    from .executor.torchrun_worker import is_worker_rank, run_worker

    if not is_worker_rank(config):
        return None
    try:
        run_worker(config)
    except RuntimeError as exc:  # rank 0's connection closed, or a step failed here
        print(f"error: this tensor-parallel rank stopped: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.command import run

    return run(args)


def _cmd_train_eagle3(args: argparse.Namespace) -> int:
    from .drafters.eagle3.training.command import run

    return run(args)


def _cmd_train_medusa(args: argparse.Namespace) -> int:
    from .drafters.medusa.training.command import run

    return run(args)


def _cmd_build_datastore(args: argparse.Namespace) -> int:
    from .drafters.retrieval.datastore_command import run

    return run(args)


def _print_metrics(output) -> None:
    m = output.metrics
    parts = [
        f"finish={output.finish_reason.value}",
        f"prompt={m.num_prompt_tokens}",
        f"output={m.num_output_tokens}",
    ]
    if m.time_to_first_token is not None:
        parts.append(f"ttft={m.time_to_first_token * 1000:.0f}ms")
    if m.time_per_output_token:
        parts.append(f"tpot={m.time_per_output_token * 1000:.1f}ms ({1 / m.time_per_output_token:.1f} tok/s)")
    parts.append(f"forwards={m.num_forwards}")
    if m.num_draft_tokens:
        parts.append(
            f"drafted={m.num_draft_tokens} accepted={m.num_accepted_tokens} "
            f"acceptance_length={m.mean_acceptance_length:.2f}"
        )
    print("[" + " ".join(parts) + "]", file=sys.stderr)


def _cmd_drafters(args: argparse.Namespace) -> int:
    """What pytest's header does for its plugins: every drafter, where it comes from, its options."""
    from .plugins.manager import get_plugin_manager, list_drafters

    for drafter in list_drafters(get_plugin_manager()):
        print(f"{' / '.join(drafter.names)}  ({drafter.source})")
        for option, default in drafter.options:
            print(f"    {option}: {default!r}")
    print(
        "speculative_config also takes max_draft_len, draft_len_schedule and draft_len_policy for every drafter"
    )
    return 0


def _show_loading() -> None:
    """Print the loader's lines (a GGUF converted once and where the copy goes, then where the model
    came from) as ``[...]`` on standard error, without -v."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(message)s]"))
    loading = logging.getLogger("specexec.loading")
    loading.addHandler(handler)
    loading.setLevel(logging.INFO)
    loading.propagate = False


def main(argv: list[str] | None = None) -> int:
    return _dispatch(_build_parser().parse_args(argv))


#: commands whose work is all written and closed when they return: the console command then exits
#: without the interpreter's teardown of torch and transformers (about 1 s here, after the answer is out)
_NO_TEARDOWN = frozenset({"run", "drafters"})


def entry() -> None:
    """The ``specexec`` console command (and ``python -m specexec``)."""
    args = _build_parser().parse_args()
    code = _dispatch(args)
    if args.command in _NO_TEARDOWN:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _dispatch(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    if not args.verbose:
        logging.getLogger("specexec").setLevel(logging.WARNING)
    _show_loading()
    try:
        commands = {
            "run": _cmd_run,
            "tune": _cmd_tune,
            "bench": _cmd_bench,
            "train-eagle3": _cmd_train_eagle3,
            "train-medusa": _cmd_train_medusa,
            "build-datastore": _cmd_build_datastore,
            "serve": _cmd_serve,
            "drafters": _cmd_drafters,
        }
        return commands[args.command](args)
    except ValueError as exc:  # bad config, bad flags, a model that cannot load
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    entry()
