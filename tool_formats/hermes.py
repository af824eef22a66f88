"""The Hermes tool-call format, the one most open models are tuned on, written and read here only.

Written into a prompt for a chat template that has no place for tools (SmolLM2's): a system message
listing the functions' signatures in ``<tools></tools>`` and asking for each call as a block
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (the payload a call object, `json_calls.py`);
an assistant's earlier calls written that way; a tool's result as a user turn in
``<tool_response></tool_response>``.

Read back from an output (a template's own tool format is often this one too: Qwen2.5's): each block
whose payload parses is a call, its ``arguments`` decoded when the model wrote them as a JSON string;
an unclosed block at the end is read as far as it goes. As an output is generated, `StreamReader`
splits the text so far into plain text and blocks, holding back a tail that may still open one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

from .json_calls import arguments_object, call_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
#: one block, or an unclosed block at the end of the text
BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
    "about what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


# ---- writing -------------------------------------------------------------------------------------------
def block_text(call: dict) -> str:
    """One OpenAI tool call (``function.arguments`` a JSON string or an object) as a Hermes block."""
    function = call.get("function", {})
    arguments = arguments_object(function.get("arguments", {}))
    return f"{OPEN}\n{call_text(function.get('name'), arguments)}\n{CLOSE}"


def prompt_messages(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict[str, Any]]:
    """The messages, tools and calls as plain text for a template that knows only role and content."""
    out = []
    if tools:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = SYSTEM.format(tools=listed)
        if messages and messages[0].get("role") == "system":
            system = f"{messages[0].get('content') or ''}\n\n{system}".lstrip()
            messages = messages[1:]
        out.append({"role": "system", "content": system})
    for m in messages:
        if m.get("role") == "tool":
            out.append(
                {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
            )
        elif m.get("role") == "assistant" and m.get("tool_calls"):
            parts = [m.get("content") or ""] + [block_text(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    return out


# ---- reading a whole output ------------------------------------------------------------------------------
class FoundCall(NamedTuple):
    start: int  #: where its block begins in the text
    end: int  #: one past where it ends
    call: Any  #: the payload's JSON (a call when `json_calls.is_call` and its function agree)


def read_blocks(text: str) -> Iterator[FoundCall]:
    """Each block of ``text`` whose payload parses, in order (string ``arguments`` decoded; a block whose
    string arguments do not parse is skipped)."""
    for match in BLOCK.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("arguments"), str):
            try:
                call["arguments"] = json.loads(call["arguments"])
            except ValueError:
                continue
        yield FoundCall(match.start(), match.end(), call)


# ---- reading as it is written ------------------------------------------------------------------------
class Plain(NamedTuple):
    end: int  #: the text up to here is not in a block


class Block(NamedTuple):
    start: int  #: ``text[start:end]`` is one block: closed, or cut short by the output's end
    end: int


class StreamReader:
    """One growing output: each `read` gives the spans the text gained, in order."""

    def __init__(self) -> None:
        self.scan_from = 0  #: where the text after the last block read begins

    def read(self, text: str, final: bool) -> list[Plain | Block]:
        """The new spans of ``text``; ``final`` once the output ended (the held-back tail is plain text
        then, and an unclosed block a block)."""
        spans: list[Plain | Block] = []
        while True:
            opener = text.find(OPEN, self.scan_from)
            if opener < 0:
                spans.append(Plain(len(text) if final else _held_back(text, self.scan_from)))
                return spans
            spans.append(Plain(opener))
            block = BLOCK.match(text, opener)
            closed = block is not None and text[block.end() - len(CLOSE) : block.end()] == CLOSE
            if not closed and not final:
                return spans
            end = block.end() if block is not None else len(text)
            spans.append(Block(opener, end))
            self.scan_from = end
            if final and not closed:
                return spans


def _held_back(text: str, start: int) -> int:
    """Where plain text may safely end: before a tail of ``text`` that could begin ``<tool_call>``."""
    for keep in range(min(len(OPEN) - 1, len(text) - start), 0, -1):
        if OPEN.startswith(text[len(text) - keep :]):
            return len(text) - keep
    return len(text)
