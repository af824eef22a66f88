"""Tools in a chat prompt (``Request.tools``, OpenAI's tool objects).

A chat template that renders ``tools`` itself (it names them: Qwen2.5's, Llama 3.1's, Hermes') gets
them, and the history's assistant ``tool_calls`` and ``tool`` results, as transformers passes them
(a call's ``arguments`` as an object). A template that does not (SmolLM2's) gets the Hermes format as
text, the one most open models are tuned on: a system message listing the functions' signatures in
``<tools></tools>`` and asking for each call as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``;
an assistant's earlier calls written that way; a tool's result as a user turn in
``<tool_response></tool_response>``. `server/tools.py` reads calls back in the same format.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
    "about what values to plug into functions. Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def chat_template_text(tokenizer) -> str:
    """The tokenizer's chat template source ("" without one; several named templates joined)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(t for t in template.values() if isinstance(t, str))
    return template if isinstance(template, str) else ""


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` itself."""
    return "tools" in chat_template_text(tokenizer)


def arguments_object(arguments: Any) -> Any:
    """A call's ``arguments`` as an object when given as a JSON string (else as given: the history is
    the caller's)."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            return json.loads(arguments)
    return arguments


def call_text(call: dict) -> str:
    """One call in the Hermes format (``arguments`` given as a JSON string or an object)."""
    function = call.get("function", {})
    arguments = arguments_object(function.get("arguments", {}))
    payload = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def hermes_messages(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict[str, Any]]:
    """The messages, tools and calls as plain text for a template that knows only role and content."""
    out = []
    if tools:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = HERMES_SYSTEM.format(tools=listed)
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
            parts = [m.get("content") or ""] + [call_text(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        else:
            out.append({k: v for k, v in m.items() if k not in ("tool_calls", "tool_call_id")})
    return out


def native_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as transformers' tool-aware templates take them: each call's arguments an object."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                function = dict(c.get("function", {}))
                if "arguments" in function:
                    function["arguments"] = arguments_object(function["arguments"])
                calls.append({**c, "function": function})
            m = {**m, "tool_calls": calls, "content": m.get("content") or ""}
        out.append(m)
    return out
