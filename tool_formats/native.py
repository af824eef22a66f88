"""Tools a chat template renders itself (it names ``tools``: Qwen2.5's, Llama 3.1's, Hermes'): the
template gets them, and the history's assistant ``tool_calls`` and ``tool`` results, as transformers
passes them (a call's ``arguments`` as an object). What such a model writes back is read as Hermes
blocks (`hermes.py`), the format most of these templates ask for.
"""

from __future__ import annotations

from typing import Any

from .json_calls import arguments_object


def chat_template_text(tokenizer) -> str:
    """The tokenizer's chat template source ("" without one; several named templates joined)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(t for t in template.values() if isinstance(t, str))
    return template if isinstance(template, str) else ""


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders ``tools`` itself."""
    return "tools" in chat_template_text(tokenizer)


def prompt_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
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
