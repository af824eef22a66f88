"""The command line's model and drafter flags (`specexec run`, `serve`, `tune`), and the
`ExecutorConfig` they make over a ``--config`` file."""

from __future__ import annotations

import argparse

from .executor.layers.quantized.auto_scheme import QUANTIZATION_SETTINGS


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", help="HF directory or GGUF file (default: the embedded SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--config", help="YAML file with executor settings (see ExecutorConfig)")
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16", "float64"],
        help="overrides the config (default auto: measured once per machine)",
    )
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATION_SETTINGS,
        help="weight-only quantization of the linear layers; overrides the config (default auto: a GGUF "
        "file at its own codes, any other model as loaded; none: a GGUF dequantized)",
    )
    parser.add_argument(
        "--model-impl",
        choices=["auto", "specexec", "transformers"],
        help="the forward: specexec's own decoder (Llama family) or transformers' modules; overrides "
        "the config (default auto: specexec where supported)",
    )
    parser.add_argument(
        "--quantized-kernel",
        choices=["auto", "torch", "int8_dot"],
        help="a CPU model's quantized layers at decode/verify rows: torch's kernels or int8_dot (integer "
        "dot products over int8 activations, llama.cpp's way); overrides the config (default auto: measured)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        help="run the target over N worker processes, sharded (CPU, gloo; default 1: one process)",
    )
    parser.add_argument(
        "--tensor-parallel-launch",
        choices=["spawn", "torchrun"],
        help="how the ranks start: spawn (worker processes on this machine, the default) or torchrun "
        "(start this same command on every rank with torchrun; rank 0 serves, the others hold shards)",
    )


def add_drafter_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--decoding-type",
        help="speculative drafter: auto (the default: Suffix under the policy that drafts only where it "
        "pays), none (off), NGram, Suffix, REST, DraftTarget, Eagle, UserProvided or a plugin's name "
        "(`specexec drafters` lists the installed ones)",
    )
    parser.add_argument(
        "--max-draft-len",
        type=int,
        default=None,
        help="draft tokens per step at most (default 3; 8 under auto)",
    )


def load_config(args: argparse.Namespace):
    from .executor.config import ExecutorConfig

    config = ExecutorConfig.from_yaml(args.config) if args.config else ExecutorConfig()
    if args.model:
        config.model = args.model
    if args.dtype:
        config.dtype = args.dtype
    if args.quantization:
        config.quantization = None if args.quantization == "none" else args.quantization
    if args.model_impl:
        config.model_impl = args.model_impl
    if args.quantized_kernel:
        config.quantized_kernel = args.quantized_kernel
    if args.tensor_parallel_size is not None:
        config.tensor_parallel_size = args.tensor_parallel_size
    if args.tensor_parallel_launch:
        config.tensor_parallel_launch = args.tensor_parallel_launch
    config.validate()
    decoding_type = getattr(args, "decoding_type", None)
    max_draft_len = getattr(args, "max_draft_len", None)
    if decoding_type in ("none", "auto"):
        config.speculative_config = None if decoding_type == "none" else "auto"
    if decoding_type not in (None, "none", "auto"):
        from .executor.engine.speculation.speculative_config import SpeculativeConfig

        config.speculative_config = SpeculativeConfig(
            decoding_type,
            max_draft_len or 3,
            options=dict(getattr(config.speculative_config, "options", {}) or {}),
        )
    elif max_draft_len is not None:
        if config.speculative_config is None:
            raise ValueError("--max-draft-len needs drafting on: --decoding-type, or a speculative_config")
        if config.speculative_config == "auto":
            from .executor.auto_defaults import auto_speculative_config

            config.speculative_config = auto_speculative_config(max_draft_len)
        config.speculative_config.max_draft_len = max_draft_len
        config.speculative_config.__post_init__()
    return config
