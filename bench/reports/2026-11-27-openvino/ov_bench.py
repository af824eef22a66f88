"""OpenVINO GenAI on the same prompts and token ids as `specexec bench`: plain greedy decoding and its
prompt lookup (k draft tokens from n-grams of the prompt), one request at a time, as many threads as
torch uses there. Run with the OpenVINO venv's python (README.md says how it was built).

    python ov_bench.py MODEL_DIR prompts.json [--max-tokens 128] [--threads 2] [--k 3] [--ngram 3]

Per request: TTFT (the streamer's first token), TPOT ((end - first token) / (tokens - 1)), tokens/s
(tokens / whole time). The summary gives medians, as `specexec bench`'s table does, and the total tok/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import openvino as ov
import openvino_genai as ov_genai


def run(pipe, prompts, max_tokens: int, lookup: dict | None):
    records = []
    for p in prompts:
        config = ov_genai.GenerationConfig()
        config.max_new_tokens = max_tokens
        config.min_new_tokens = max_tokens  # ignore EOS: exactly max_tokens, as --ignore-eos
        config.do_sample = False
        if lookup:
            config.num_assistant_tokens = lookup["k"]
            config.max_ngram_size = lookup["ngram"]
        first: list[float] = []  # when the first token streamed

        def streamer(_subword, first=first):
            if not first:
                first.append(time.perf_counter())
            return ov_genai.StreamingStatus.RUNNING

        ids = ov.Tensor(np.array([p["token_ids"]], dtype=np.int64))
        mask = ov.Tensor(np.ones((1, len(p["token_ids"])), dtype=np.int64))
        start = time.perf_counter()
        result = pipe.generate(ov_genai.TokenizedInputs(ids, mask), config, streamer)
        end = time.perf_counter()
        tokens = len(result.tokens[0])
        ttft = first[0] - start
        records.append(
            dict(
                id=p["id"],
                tokens=tokens,
                ttft=ttft,
                tpot=(end - first[0]) / max(1, tokens - 1),
                seconds=end - start,
            )
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("prompts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--ngram", type=int, default=3)
    args = parser.parse_args()
    with open(args.prompts) as f:
        prompts = json.load(f)
    props = {"INFERENCE_NUM_THREADS": args.threads}
    print(f"openvino {ov.get_version()}, openvino_genai {ov_genai.__version__}, {args.threads} threads")
    for name, lookup in (("plain", None), (f"prompt lookup k={args.k}", {"k": args.k, "ngram": args.ngram})):
        extra = {"prompt_lookup": True} if lookup else {}
        pipe = ov_genai.LLMPipeline(args.model, "CPU", **props, **extra)
        run(pipe, prompts[:1], 8, lookup)  # warm-up
        records = run(pipe, prompts, args.max_tokens, lookup)
        tokens = sum(r["tokens"] for r in records)
        seconds = sum(r["seconds"] for r in records)
        print(
            f"{name:22} TTFT p50 {1e3 * statistics.median(r['ttft'] for r in records):7.1f} ms  "
            f"TPOT p50 {1e3 * statistics.median(r['tpot'] for r in records):6.2f} ms  "
            f"tok/s {tokens / seconds:6.1f}  ({len(records)} requests, {tokens} tokens)"
        )
        del pipe


if __name__ == "__main__":
    main()
