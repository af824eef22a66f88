"""Benchmark datasets, chosen by name, turned into chat prompts (and, where they have one, a schema)."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
JSONSCHEMABENCH_SPLITS = ("Github_trivial", "Github_easy", "Github_medium", "Glaiveai2K", "Kubernetes")
DATASETS = (
    "extraction",
    "deepjsoneval",
    "specbench[:category]",
    "jsonschemabench:<split>",
    "bfcl",
    "humaneval",
    "multiturn",
)
MULTITURN_TURNS = 5  #: user turns in each conversation of the multiturn set


@dataclass(slots=True)
class BenchPrompt:
    id: str
    messages: list[dict[str, str]]  #: chat messages, rendered with the model's chat template
    schema: dict[str, Any] | None = None  #: JSON schema the output should follow, if any
    #: a conversation's later user turns: each is sent after the model's answer to the turn before
    follow_ups: list[str] = field(default_factory=list)
    #: tools the prompt may call (OpenAI's tool objects), and whether it expects several calls at once
    tools: list[dict[str, Any]] | None = None
    parallel_calls: bool = False
    #: the prompt without the instructions that stand in for tools (sent when tools go in the request)
    tool_messages: list[dict[str, str]] | None = None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _extraction() -> list[BenchPrompt]:
    prompts = []
    for r in _read_jsonl(DATA_DIR / "deepjsoneval_en.jsonl"):
        user = (
            "Extract the information from the text below into JSON that follows this JSON schema.\n\n"
            f"Schema:\n{json.dumps(r['schema'])}\n\nText:\n{r['text'].strip()}\n\n"
            "Answer with the JSON only."
        )
        prompts.append(BenchPrompt(r["id"], [{"role": "user", "content": user}], r["schema"]))
    return prompts


def extraction_documents() -> dict[str, str]:
    """The extraction set's documents (without their schemas), by prompt id."""
    return {r["id"]: r["text"].strip() for r in _read_jsonl(DATA_DIR / "deepjsoneval_en.jsonl")}


def _specbench(category: str | None) -> list[BenchPrompt]:
    records = _read_jsonl(DATA_DIR / "specbench_questions.jsonl")
    categories = sorted({r["category"] for r in records})
    if category is not None and category not in categories:
        raise ValueError(f"unknown specbench category {category!r}; known: {', '.join(categories)}")
    return [
        BenchPrompt(f"specbench/{r['id']}", [{"role": "user", "content": r["turns"][0]}])
        for r in records
        if category is None or r["category"] == category
    ]


def _multiturn() -> list[BenchPrompt]:
    """Conversations of `MULTITURN_TURNS` user turns, Spec-Bench's first turns taken in order (its own
    second turns are few): conversation c asks questions 5c .. 5c + 4."""
    questions = [r["turns"][0] for r in _read_jsonl(DATA_DIR / "specbench_questions.jsonl")]
    n = MULTITURN_TURNS
    return [
        BenchPrompt(
            f"multiturn/{c}",
            [{"role": "user", "content": questions[c * n]}],
            follow_ups=questions[c * n + 1 : c * n + n],
        )
        for c in range(len(questions) // n)
    ]


def _jsonschemabench(split: str) -> list[BenchPrompt]:
    if split not in JSONSCHEMABENCH_SPLITS:
        raise ValueError(
            f"unknown jsonschemabench split {split!r}; known: {', '.join(JSONSCHEMABENCH_SPLITS)}"
        )
    system = "You need to generate a JSON object that matches the schema below."
    return [
        BenchPrompt(
            r["id"],
            [{"role": "system", "content": system}, {"role": "user", "content": json.dumps(r["schema"])}],
            r["schema"],
        )
        for r in _read_jsonl(DATA_DIR / "jsonschemabench" / f"{split}.jsonl")
    ]


def _bfcl() -> list[BenchPrompt]:
    """BFCL's prompts. As text: the functions listed in the system prompt and the call's JSON schema as
    the prompt's schema. With tools (`tool_messages`, `tools`): the functions as OpenAI tools, their
    dotted names (``math.factorial``) spelled with ``_`` as OpenAI's names must be."""
    prompts = []
    for r in _read_jsonl(DATA_DIR / "bfcl_v4_subset.jsonl"):
        functions = r["functions"] if isinstance(r["functions"], str) else json.dumps(r["functions"])
        given = r["system"] if r["system"] not in (None, "None") else None
        system = (given or "You are a helpful assistant.") + (
            '\nYou can call these functions; answer with one JSON object {"name": ..., "arguments": {...}}:\n'
            + functions
        )
        schema = r["schema"] if isinstance(r["schema"], dict) else ast.literal_eval(r["schema"])
        prompt = BenchPrompt(
            r["id"], [{"role": "system", "content": system}, {"role": "user", "content": r["user"]}], schema
        )
        prompt.tools = _bfcl_tools(r["functions"], schema)
        prompt.parallel_calls = r["category"] == "parallel"
        prompt.tool_messages = ([{"role": "system", "content": given}] if given else []) + [
            {"role": "user", "content": r["user"]}
        ]
        prompts.append(prompt)
    return prompts


def _bfcl_tools(functions, call_schema: dict) -> list[dict[str, Any]]:
    """OpenAI tools of a BFCL record: each function's description, and its parameters as the record's
    call schema has them in JSON Schema (BFCL's own use ``dict``, ``float``, ``tuple``)."""
    if isinstance(functions, str):
        functions = json.loads(functions)
    parameters: dict[str, dict] = {}

    def collect(node) -> None:
        if isinstance(node, dict):
            name = node.get("properties", {}).get("name", {})
            if isinstance(name, dict) and "const" in name and "arguments" in node["properties"]:
                parameters[name["const"]] = node["properties"]["arguments"]
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(call_schema)
    return [
        {
            "type": "function",
            "function": {
                "name": f["name"].replace(".", "_"),
                "description": f.get("description", ""),
                "parameters": parameters[f["name"]],
            },
        }
        for f in functions
    ]


def _humaneval() -> list[BenchPrompt]:
    return [
        BenchPrompt(
            r["task_id"],
            [{"role": "user", "content": "Complete this Python function:\n\n" + r["prompt"]}],
        )
        for r in _read_jsonl(DATA_DIR / "humaneval_prompts.jsonl")
    ]


def _user_file(path: Path) -> list[BenchPrompt]:
    prompts = []
    for i, r in enumerate(_read_jsonl(path)):
        turns = r.get("turns")
        if turns is not None and (
            not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns)
        ):
            raise ValueError(f"{path}: line {i + 1}: 'turns' must be a list of user messages")
        if "prompt" not in r and turns is None:
            raise ValueError(f"{path}: line {i + 1} has no 'prompt' (or 'turns')")
        prompt = r["prompt"] if turns is None else turns[0]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        schema = r.get("schema")
        fmt = r.get("response_format")
        if schema is None and isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            schema = fmt.get("json_schema", {}).get("schema")
        follow_ups = list(turns[1:]) if turns else []
        prompts.append(BenchPrompt(str(r.get("id", f"{path.stem}/{i}")), messages, schema, follow_ups))
    return prompts


def load_dataset(name: str, num_requests: int | None = None) -> list[BenchPrompt]:
    """Prompts of a named dataset (see `DATASETS`) or of a JSONL file with `prompt` (a user message or a
    list of messages) or `turns` (a conversation's user messages) per line."""
    base, _, arg = name.partition(":")
    if base in ("extraction", "deepjsoneval") and not arg:
        prompts = _extraction()
    elif base == "specbench":
        prompts = _specbench(arg or None)
    elif base == "jsonschemabench" and arg:
        prompts = _jsonschemabench(arg)
    elif base == "bfcl" and not arg:
        prompts = _bfcl()
    elif base == "humaneval" and not arg:
        prompts = _humaneval()
    elif base == "multiturn" and not arg:
        prompts = _multiturn()
    elif name.endswith(".jsonl") and Path(name).is_file():
        prompts = _user_file(Path(name))
    else:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}, or a .jsonl file")
    if not prompts:
        raise ValueError(f"dataset {name!r} has no prompts")
    return spread(prompts, num_requests) if num_requests else prompts


def spread(prompts: list[BenchPrompt], num_requests: int) -> list[BenchPrompt]:
    """The first num_requests prompts of the list's evenly spread order (`spread_order`): every part
    of the list gets a share, and a smaller draw is always part of a larger one, so the prompts held
    out from training (the first `MAX_BENCH_REQUESTS` of the order) contain every draw up to that size."""
    return [prompts[i] for i in spread_order(len(prompts))[:num_requests]]


def spread_order(length: int) -> list[int]:
    """Indices 0..length-1 in van der Corput order: 0, 1/2, 1/4, 3/4, 1/8, ... of the way through."""
    order: list[int] = []
    seen: set[int] = set()
    bits = max(1, (length - 1).bit_length())
    for i in range(2**bits):
        fraction = int(f"{i:0{bits}b}"[::-1], 2) / 2**bits  # bit-reversed i
        index = int(fraction * length)
        if index not in seen:
            seen.add(index)
            order.append(index)
    return order
