"""`specexec train-eagle3`: its flags (cheap to import, so `specexec --help` stays fast); the work is
in `train`."""

from __future__ import annotations

from ...training.machine import add_machine_arguments


def add_arguments(parser) -> None:
    parser.add_argument("--output", required=True, help="directory for the head, corpus and logs")
    parser.add_argument("--model", help="target: HF directory or GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--max-minutes", type=float, default=60.0, help="whole run's time budget")
    parser.add_argument("--corpus-minutes", type=float, default=22.0, help="of which generating answers")
    parser.add_argument("--num-prompts", type=int, default=5000, help="training prompts to answer at most")
    parser.add_argument(
        "--self-instruct",
        type=int,
        default=3000,
        help="instructions the target writes itself, after the bundled prompts (0 = bundled prompts only)",
    )
    parser.add_argument(
        "--pool-minutes",
        type=float,
        default=10.0,
        help="for writing them (at most a third of --corpus-minutes)",
    )
    parser.add_argument(
        "--pool-share",
        type=float,
        default=0.5,
        help="of the prompts answered, the share taken from the self-instruct pool while it lasts",
    )
    parser.add_argument(
        "--document-tasks",
        type=int,
        default=0,
        help="prompts built from documents the corpus already has (summaries and RAG questions over the "
        "target's earlier answers, summaries of non-held-out extraction documents), taken in turn with "
        "the pool's instructions (see drafters/eagle3/training/documents.py)",
    )
    parser.add_argument(
        "--sampled-temperature",
        type=float,
        default=0.7,
        help="also one sampled answer per prompt at this temperature (0 = greedy answers only)",
    )
    parser.add_argument(
        "--corpus-only",
        action="store_true",
        help="grow the corpus, report its size and stop (rerun to continue)",
    )
    parser.add_argument(
        "--archive",
        help="directory of the corpus's token archive: answers and instructions it holds are restored "
        "(features rebuilt by prefill) instead of generated again, and new ones are added to it; default: "
        "the archive bundled for the default model when --model is not given, else none ('none': off)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="answer length at most")
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=4096,
        help="longer prompts are not answered (a long prompt keeps only its last --max-len positions)",
    )
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--ttt-steps", type=int, default=4, help="unrolled training-time-test steps")
    parser.add_argument("--max-len", type=int, default=640, help="positions per sequence trained on")
    parser.add_argument(
        "--sliding-window",
        type=int,
        help="the head attends only its last N positions, in training and drafting (written to its "
        "config.json; 0: every position); more than --ttt-steps and at most --max-len, the positions a "
        "sequence is trained on (default: 512, or --max-len when that is smaller)",
    )
    parser.add_argument("--batch-tokens", type=int, default=4096, help="positions per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=100, help="optimizer steps between validations")
    parser.add_argument(
        "--patience", type=int, default=5, help="stop after this many validations without a better head"
    )
    parser.add_argument(
        "--init-from",
        help="start from this head directory ('shipped': the head shipped for the default model) and its "
        "draft vocabulary instead of from the target's weights (ignored once a checkpoint exists)",
    )
    parser.add_argument(
        "--fresh-vocab",
        action="store_true",
        help="with --init-from: choose the draft vocabulary (--draft-vocab-size tokens) from this corpus; "
        "tokens the head had keep their trained rows, new ones start from the target's",
    )
    parser.add_argument(
        "--mlp-width",
        type=int,
        help="MLP units of the head's layer (default: the target's); with --init-from, at least the start "
        "head's: its units are kept and the new ones start adding nothing",
    )
    add_machine_arguments(parser)


def run(args) -> int:
    from .train import train

    return train(args)
