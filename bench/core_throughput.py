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
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from specexec import Executor, ExecutorConfig, Request, SamplingParams
from specexec.executor.model_loader import load_model

DATA = Path(__file__).parent / "data" / "specbench_sample.jsonl"
PHASES = ("load", "warm up", "specexec batch 1", "HF batch 1", "specexec batched", "HF batched")
GOAL_BATCH1, GOAL_SCALING = 1.0, 4.0


def load_prompts(tokenizer, num_requests: int) -> list[list[int]]:
    """Token ids of the first `num_requests` sample questions' first turns, chat-rendered."""
    questions = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    if num_requests > len(questions):
        raise SystemExit(f"--num-requests {num_requests}: the sample has {len(questions)} questions")
    return [
        list(tokenizer.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=True
        )["input_ids"])
        for q in questions[:num_requests]
    ]


def timed(fn, repeats: int) -> tuple[list[list[int]], list[float]]:
    """Run `fn` `repeats` times; its outputs (from the last run) and each run's wall time."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = fn()
        seconds.append(time.perf_counter() - start)
    return outputs, seconds


def throughput(outputs: list[list[int]], seconds: list[float], **extra) -> dict:
    """Tokens/s of the best run: total new tokens / wall time."""
    num_tokens = sum(len(o) for o in outputs)
    return {"num_tokens": num_tokens, "seconds": seconds, "tok_s": num_tokens / min(seconds), **extra}


def specexec_generate(executor: Executor, prompts: list[list[int]], max_tokens: int, batched: bool):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if batched:
        return [o.token_ids for o in executor.run([Request(p, params) for p in prompts])]
    return [executor.run([Request(p, params)])[0].token_ids for p in prompts]


def hf_generate(model, tokenizer, prompts: list[list[int]], max_tokens: int, batched: bool):
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                  pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                  else tokenizer.eos_token_id)
    if not batched:
        outputs = []
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            outputs.append(out[0, ids.shape[1]:].tolist())
        return outputs
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt")
    out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)
    return out[:, batch["input_ids"].shape[1]:].tolist()


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
    def phase(name: str) -> None:
        bar.set_description(f"{dtype}: {name}")

    phase("load")
    spec, hf = load_model(None, dtype=dtype, progress=False), load_model(None, dtype=dtype, progress=False)
    executor = Executor(model=spec.model, config=ExecutorConfig(dtype=dtype, device="cpu"),
                        tokenizer=spec.tokenizer)
    prompts = load_prompts(spec.tokenizer, args.num_requests)
    result["prompt_lengths"] = [len(p) for p in prompts]
    bar.update()
    phase("warm up")
    specexec_generate(executor, prompts[:1], 8, batched=False)
    hf_generate(hf.model, hf.tokenizer, prompts[:1], 8, batched=False)
    bar.update()
    phase("specexec batch 1")
    spec_b1, seconds = timed(lambda: specexec_generate(executor, prompts, args.max_tokens, False), args.repeats)
    result["specexec_batch1"] = throughput(spec_b1, seconds)
    bar.update()
    phase("HF batch 1")
    hf_b1, seconds = timed(lambda: hf_generate(hf.model, hf.tokenizer, prompts, args.max_tokens, False),
                           args.repeats)
    result["hf_batch1"] = throughput(hf_b1, seconds)
    result["match_batch1"] = match_rate(spec_b1, hf_b1, executor.eos_token_ids)
    bar.update()
    phase("specexec batched")
    spec_bn, seconds = timed(lambda: specexec_generate(executor, prompts, args.max_tokens, True), args.repeats)
    result["specexec_batched"] = throughput(spec_bn, seconds)
    result["match_specexec_batched_vs_batch1"] = match_rate(spec_bn, spec_b1, executor.eos_token_ids)
    bar.update()
    phase("HF batched")
    hf_bn, seconds = timed(lambda: hf_generate(hf.model, hf.tokenizer, prompts, args.max_tokens, True),
                           args.repeats)
    result["hf_padded_batch"] = throughput(hf_bn, seconds)
    result["hf_sequential"] = {**result["hf_batch1"], "note": "the HF batch 1 run (same work)"}
    best = max(("padded_batch", "sequential"), key=lambda k: result[f"hf_{k}"]["tok_s"])
    result["hf_batched_best"] = {"mode": best, "tok_s": result[f"hf_{best}"]["tok_s"]}
    bar.update()


def goals(result: dict) -> dict:
    out = {}
    if "specexec_batch1" in result and "hf_batch1" in result:
        ratio = result["specexec_batch1"]["tok_s"] / result["hf_batch1"]["tok_s"]
        out["batch1_vs_hf"] = {"ratio": ratio, "goal": GOAL_BATCH1, "pass": ratio >= GOAL_BATCH1}
    if "specexec_batched" in result:
        ratio = result["specexec_batched"]["tok_s"] / result["specexec_batch1"]["tok_s"]
        out["batched_vs_batch1"] = {"ratio": ratio, "goal": GOAL_SCALING, "pass": ratio >= GOAL_SCALING}
    return out


def format_table(results: dict, num_requests: int) -> str:
    header = ("dtype", "mode", "specexec tok/s", "HF tok/s", "HF mode", "spec/HF", "goal", "ratio", "")
    rows = [header]
    for dtype, r in results.items():
        g = goals(r)
        for mode, spec_key, goal_key in (("batch1", "specexec_batch1", "batch1_vs_hf"),
                                         (f"batch{num_requests}", "specexec_batched", "batched_vs_batch1")):
            spec = r.get(spec_key, {}).get("tok_s")
            hf = (r.get("hf_batch1", {}) if mode == "batch1" else r.get("hf_batched_best", {})).get("tok_s")
            hf_mode = "sequential" if mode == "batch1" else r.get("hf_batched_best", {}).get("mode", "-")
            goal = g.get(goal_key)
            goal_text = ("spec/HF >= 1.0" if mode == "batch1" else f"batch{num_requests}/batch1 >= 4.0")
            rows.append((
                dtype, mode, f"{spec:.1f}" if spec else "-", f"{hf:.1f}" if hf else "-",
                hf_mode if hf else "-", f"{spec / hf:.2f}" if spec and hf else "-", goal_text,
                f"{goal['ratio']:.2f}" if goal else "-",
                ("PASS" if goal["pass"] else "MISS") if goal else "-",
            ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < 2 or i in (4, 6) else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    for dtype, r in results.items():
        if "match_batch1" in r:
            m = r["match_batch1"]
            lines.append(f"{dtype}: specexec vs HF at batch 1: {m['identical_fraction']:.0%} identical, "
                         f"mean common prefix {m['mean_prefix_fraction']:.1%} "
                         f"({m['num_specexec_with_eos']} specexec outputs contain EOS)")
    return "\n".join(lines)


def machine_info() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpu": cpu, "python": platform.python_version()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per phase; the best counts")
    parser.add_argument("--output", help="write every number as JSON here")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    report = {"command": [sys.executable, "-m", "specexec.bench.core_throughput", *sys.argv[1:]],
              "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": machine_info(), "args": vars(args), "results": {}, "interrupted": False}
    start = time.perf_counter()
    try:
        with tqdm(total=len(dtypes) * len(PHASES), file=sys.stderr) as bar:
            for dtype in dtypes:
                result = report["results"][dtype] = {}
                bench_dtype(dtype, args, result, bar)
                result["goals"] = goals(result)
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
