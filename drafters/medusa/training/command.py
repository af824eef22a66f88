"""`specexec train-medusa`: its flags (cheap to import, so `specexec --help` stays fast); the work is in
`train`."""

from __future__ import annotations

from ...training.machine import add_machine_arguments


def add_arguments(parser) -> None:
    parser.add_argument("--output", required=True, help="directory for the heads, corpus and logs")
    parser.add_argument("--model", help="target: HF directory or GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--max-minutes", type=float, default=40.0, help="whole run's time budget")
    parser.add_argument(
        "--corpus-minutes",
        type=float,
        default=15.0,
        help="of which building the corpus (archived answers prefilled, new ones generated)",
    )
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=2000,
        help="training prompts to answer at most, after the archive's answers (EAGLE-3's bundled prompts)",
    )
    parser.add_argument(
        "--archive",
        help="directory of a corpus token archive (`specexec train-eagle3`'s): its greedy answers are "
        "prefilled instead of generated; default: the archive bundled for the default model when "
        "--model is not given, else none ('none': off)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="answer length at most")
    parser.add_argument("--max-prompt-tokens", type=int, default=4096, help="longer prompts are not answered")
    parser.add_argument("--num-heads", type=int, default=4, help="heads, and so drafts a step at most")
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=1024, help="positions per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--head-decay",
        type=float,
        default=0.8,
        help="head k's loss is weighted by this to the power k (Medusa's: later heads matter less)",
    )
    parser.add_argument("--eval-every", type=int, default=200, help="optimizer steps between validations")
    parser.add_argument(
        "--patience", type=int, default=5, help="stop after this many validations without better heads"
    )
    add_machine_arguments(parser)


def run(args) -> int:
    from .train import train

    return train(args)
