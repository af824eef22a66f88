"""Issue 2: specexec's core executor against Hugging Face `generate`, side by side, on CPU.

For each dtype, on the same Spec-Bench prompts (first turn, chat template), greedy, exactly
`--max-tokens` new tokens per request:

- batch 1: specexec `Executor.run([request])` one prompt at a time vs HF `generate` one at a time;
- N requests: specexec `Executor.run(all N)` vs the faster of HF's left-padded batch `generate` and
  HF one at a time (the batch-1 run: the same work, so it is not run twice);
- token match of specexec vs HF at batch 1.

Goals: specexec batch 1 >= HF batch 1; specexec N-request throughput >= 4x its batch-1 throughput.

    python -m specexec.bench.core_throughput --dtypes float32,bfloat16 --max-tokens 128 --output r.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from tqdm import tqdm

from .. import Executor, ExecutorConfig, Request, SamplingParams
from ..executor.layers.cpu_info import describe_cpu
from ..executor.model.model_loader import load_model
from ..prompt_sets.datasets import DATA_DIR

DATA = DATA_DIR / "specbench_sample.jsonl"
NUM_PHASES = 6  # load, warm up, specexec batch 1, HF batch 1, specexec batched, HF batched
GOAL_BATCH1, GOAL_SCALING = 1.0, 4.0


def load_prompts(tokenizer, num_requests: int) -> list[list[int]]:
    """Token ids of the first `num_requests` sample questions' first turns, chat-rendered."""
    questions = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    if num_requests > len(questions):
        raise SystemExit(f"--num-requests {num_requests}: the sample has {len(questions)} questions")
    chats = [[{"role": "user", "content": q["turns"][0]}] for q in questions[:num_requests]]
    return [list(tokenizer.apply_chat_template(c, add_generation_prompt=True)["input_ids"]) for c in chats]


def timed(fn, repeats: int) -> tuple[list[list[int]], list[float]]:
    """Run `fn` `repeats` times; its outputs (from the last run) and each run's wall time."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = fn()
        seconds.append(time.perf_counter() - start)
    return outputs, seconds


def throughput(outputs: list[list[int]], seconds: list[float]) -> dict:
    """Tokens/s of the best run: total new tokens / wall time."""
    num_tokens = sum(len(o) for o in outputs)
    return {"num_tokens": num_tokens, "seconds": seconds, "tok_s": num_tokens / min(seconds)}


def specexec_generate(executor: Executor, prompts: list[list[int]], max_tokens: int, batched: bool):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if batched:
        return [o.token_ids for o in executor.run([Request(p, params) for p in prompts])]
    return [executor.run([Request(p, params)])[0].token_ids for p in prompts]


def hf_generate(model, tokenizer, prompts: list[list[int]], max_tokens: int, batched: bool):
    pad_token_id = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    kwargs = dict(
        max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad_token_id
    )
    if not batched:
        outputs = []
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            outputs.append(out[0, ids.shape[1] :].tolist())
        return outputs
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)
    return out[:, batch["input_ids"].shape[1] :].tolist()


def match_rate(ours: list[list[int]], reference: list[list[int]], eos_ids) -> dict:
    """Fraction of identical sequences and mean common-prefix fraction (of the reference length)."""
    prefixes = []
    for a, b in zip(ours, reference):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefixes.append(n / max(len(b), 1))
    return {
        "num_sequences": len(prefixes),
        "identical_fraction": sum(a == b for a, b in zip(ours, reference)) / max(len(prefixes), 1),
        "mean_prefix_fraction": sum(prefixes) / max(len(prefixes), 1),
        "prefix_fractions": prefixes,
        # HF's min_new_tokens forbids EOS, specexec's ignore_eos does not: they differ there by design
        "num_specexec_with_eos": sum(any(t in eos_ids for t in a) for a in ours),
    }


def bench_dtype(dtype: str, args, result: dict, bar: tqdm) -> None:
    """Fill `result` phase by phase, so an interrupted run keeps what it measured."""
    bar.set_description(f"{dtype}: load")
    # two instances: the Executor switches its model's attention to the paged kernel
    spec, hf = (load_model(None, dtype=dtype, progress=False) for _ in range(2))
    executor = Executor(spec.model, ExecutorConfig(dtype=dtype, device="cpu"), tokenizer=spec.tokenizer)
    run_spec = functools.partial(specexec_generate, executor)
    run_hf = functools.partial(hf_generate, hf.model, hf.tokenizer)
    prompts = load_prompts(spec.tokenizer, args.num_requests)
    result["prompt_lengths"] = [len(p) for p in prompts]
    bar.update()

    bar.set_description(f"{dtype}: warm up")
    run_spec(prompts[:1], 8, batched=False)
    run_hf(prompts[:1], 8, batched=False)
    bar.update()

    def measure(key: str, generate, batched: bool) -> list[list[int]]:
        bar.set_description(f"{dtype}: {key}")
        outputs, seconds = timed(lambda: generate(prompts, args.max_tokens, batched=batched), args.repeats)
        result[key] = throughput(outputs, seconds)
        bar.update()
        return outputs

    eos = executor.eos_token_ids
    spec_b1 = measure("specexec_batch1", run_spec, batched=False)
    hf_b1 = measure("hf_batch1", run_hf, batched=False)
    result["hf_batch1"]["mode"] = "sequential"
    result["match_batch1"] = match_rate(spec_b1, hf_b1, eos)
    spec_batched = measure("specexec_batched", run_spec, batched=True)
    result["match_specexec_batched_vs_batch1"] = match_rate(spec_batched, spec_b1, eos)
    measure("hf_padded_batch", run_hf, batched=True)
    result["hf_sequential"] = {**result["hf_batch1"], "note": "the HF batch 1 run: the same work"}
    best = max(("hf_padded_batch", "hf_sequential"), key=lambda k: result[k]["tok_s"])
    result["hf_batched_best"] = {"mode": best.removeprefix("hf_"), "tok_s": result[best]["tok_s"]}


def goals(result: dict) -> dict:
    """The two goal ratios, for whichever phases were measured."""
    out = {}
    if "hf_batch1" in result:
        ratio = result["specexec_batch1"]["tok_s"] / result["hf_batch1"]["tok_s"]
        out["batch1_vs_hf"] = {"ratio": ratio, "goal": GOAL_BATCH1, "pass": ratio >= GOAL_BATCH1}
    if "specexec_batched" in result:
        ratio = result["specexec_batched"]["tok_s"] / result["specexec_batch1"]["tok_s"]
        out["batched_vs_batch1"] = {"ratio": ratio, "goal": GOAL_SCALING, "pass": ratio >= GOAL_SCALING}
    return out


HEADER = ("dtype", "mode", "specexec tok/s", "HF tok/s", "HF mode", "spec/HF", "goal", "ratio", "")
ROW = "{:<9} {:<7} {:>14}  {:>8}  {:<12} {:>7}  {:<22} {:>5}  {}"
TABLE_ROWS = (  # mode, specexec result, HF result, goal, goal text
    ("batch1", "specexec_batch1", "hf_batch1", "batch1_vs_hf", f"spec/HF >= {GOAL_BATCH1}"),
    (
        "batch{n}",
        "specexec_batched",
        "hf_batched_best",
        "batched_vs_batch1",
        f"batch{{n}}/batch1 >= {GOAL_SCALING}",
    ),
)


def _num(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def format_table(results: dict, num_requests: int) -> str:
    """Rows dtype x {batch1, batchN}; each row shows the goal it is judged by."""
    lines = [ROW.format(*HEADER)]
    for dtype, r in results.items():
        for mode, spec_key, hf_key, goal_key, goal_text in TABLE_ROWS:
            spec, hf = r.get(spec_key, {}).get("tok_s"), r.get(hf_key, {}).get("tok_s")
            goal = goals(r).get(goal_key, {})
            verdict = ("PASS" if goal["pass"] else "MISS") if goal else "-"
            cells = (
                _num(spec),
                _num(hf),
                r.get(hf_key, {}).get("mode", "-"),
                _num(spec and hf and spec / hf, ".2f"),
            )
            goal_cells = (goal_text.format(n=num_requests), _num(goal.get("ratio"), ".2f"), verdict)
            lines.append(ROW.format(dtype, mode.format(n=num_requests), *cells, *goal_cells))
    for dtype, r in results.items():
        if m := r.get("match_batch1"):
            lines.append(
                f"{dtype}: specexec vs HF at batch 1: {m['identical_fraction']:.0%} of sequences identical, "
                f"mean common prefix {m['mean_prefix_fraction']:.1%} "
                f"({m['num_specexec_with_eos']} specexec outputs contain EOS)"
            )
    return "\n".join(lines)


def machine_info() -> dict:
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu": describe_cpu(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per phase; the best counts")
    parser.add_argument("--output", help="write every number as JSON here")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    report: dict[str, Any] = {
        "command": [sys.executable, "-m", "specexec.bench.core_throughput", *sys.argv[1:]],
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "args": vars(args),
        "results": {},
        "interrupted": False,
    }
    start = time.perf_counter()
    try:
        with tqdm(total=len(dtypes) * NUM_PHASES, file=sys.stderr) as bar:
            for dtype in dtypes:
                bench_dtype(dtype, args, report["results"].setdefault(dtype, {}), bar)
    except KeyboardInterrupt:
        report["interrupted"] = True
        print("\ninterrupted: reporting what was measured", file=sys.stderr)
    for result in report["results"].values():
        result["goals"] = goals(result)
    report["total_seconds"] = time.perf_counter() - start
    print(format_table(report["results"], args.num_requests))
    print(f"total time {report['total_seconds']:.0f} s" + (" (interrupted)" if report["interrupted"] else ""))
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
