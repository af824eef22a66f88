"""Tool calls on ``/v1/chat/completions``: OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``.

This is the protocol's side; the formats the calls are written and read in are `tool_formats/`. The tools
go into the prompt through the chat template, or in the Hermes format where the template has no place
for them (`tool_formats/hermes.py`). Then, by ``tool_choice``:

- ``none``: the model answers in text; nothing is read as a call.
- ``auto`` (the default with tools): the model writes text or calls; each Hermes block in the output
  that names a tool and whose arguments validate against its parameters is returned as a call, the rest
  as content.
- ``required`` and a named function are *guided*: the output is held by a grammar to a JSON call (a
  list of calls when ``parallel_tool_calls``), ``{"name": <a tool's name>, "arguments": <its
  parameters' schema>}`` (`guided_format`, `tool_formats/json_calls.py`; at most `MAX_PARALLEL_CALLS`
  in a list), so every call returned parses and validates, and the executor checks the whole output
  against that schema as it checks any guided output. Drafts stay on.

A response with calls has ``message.tool_calls`` (``function.arguments`` a JSON string) and
``finish_reason: "tool_calls"``. Streamed, the calls come as they are generated (`tool_stream.py`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from ..tool_formats import hermes, json_calls
from .bad_request import BadRequest

CHOICES = ("none", "auto", "required")
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  #: OpenAI's rule for a function's name
NO_PARAMETERS = {"type": "object", "properties": {}}
#: calls in one guided answer at most (the grammar's bound: a model that never closes the list stops)
MAX_PARALLEL_CALLS = 16


@dataclass(slots=True)
class ToolPlan:
    """The request's tools and how calls are made."""

    tools: list[dict]  #: as sent (validated)
    choice: str  #: none, auto, required, or named
    name: str | None = None  #: the function a named choice forces
    parallel: bool = True  #: several calls in one answer (parallel_tool_calls)
    parameters: dict[str, dict] = field(default_factory=dict)  #: function name -> its parameters' schema

    @property
    def is_guided(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def reads_calls(self) -> bool:
        return self.choice != "none"


def parse_tools(body: dict) -> ToolPlan | None:
    """The plan of a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``; None when it
    has no tools. A bad value is a 400 naming the field."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise BadRequest("parallel_tool_calls must be true or false", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise BadRequest("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list of function tools", "tools")
    parameters: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise BadRequest(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}', "tools")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise BadRequest(f"tools[{i}].function.name must be 1-64 letters, digits, _ or -", "tools")
        if name in parameters:
            raise BadRequest(f"tools[{i}]: a second function named {name!r}", "tools")
        schema = function.get("parameters", NO_PARAMETERS)
        if not isinstance(schema, dict):
            raise BadRequest(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise BadRequest(
                f"tools[{i}].function.parameters is not a valid JSON schema: {exc.message}", "tools"
            ) from None
        unknown = set(function) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise BadRequest(f"tools[{i}].function: not supported: {', '.join(sorted(unknown))}", "tools")
        parameters[name] = schema
    plan = ToolPlan(tools, "auto", parallel=parallel, parameters=parameters)
    if choice is None or choice in CHOICES:
        plan.choice = choice or "auto"
    elif (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
    ):
        name = choice["function"].get("name")
        if name not in parameters:
            raise BadRequest(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
        plan.choice, plan.name = "named", name
    else:
        raise BadRequest('tool_choice must be "none", "auto", "required" or a named function', "tool_choice")
    return plan


def guided_format(plan: ToolPlan) -> dict | None:
    """The response_format holding a required or named choice's output to calls (None otherwise)."""
    if not plan.is_guided:
        return None
    names = [plan.name] if plan.choice == "named" else list(plan.parameters)
    as_list = plan.parallel and plan.choice != "named"
    schema = json_calls.calls_schema({n: plan.parameters[n] for n in names}, as_list)
    return {"type": "json_schema", "json_schema": {"name": "tool_calls", "schema": schema, "strict": True}}


def read_calls(plan: ToolPlan, text: str) -> tuple[str | None, list[dict]]:
    """(content, calls) of an output: a guided output is the calls' JSON; otherwise Hermes blocks that
    name a tool and whose arguments validate are calls, and what is left is the content."""
    if not plan.reads_calls:
        return text, []
    if plan.is_guided:
        values = json_calls.read_values(text)
        if values is None:  # cut short (max_tokens): returned as it is, as text
            return text, []
        calls = [c for c in values if _valid(plan, c)]
        return (None, calls) if calls else (text, [])
    calls, kept, at = [], [], 0
    for found in hermes.read_blocks(text):
        if _valid(plan, found.call) and (plan.parallel or not calls):
            calls.append(found.call)
            kept.append(text[at : found.start])
            at = found.end
    kept.append(text[at:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


def _valid(plan: ToolPlan, call: Any) -> bool:
    if not json_calls.is_call(call) or call["name"] not in plan.parameters:
        return False
    if plan.choice == "named" and call["name"] != plan.name:
        return False
    try:
        jsonschema.validate(call["arguments"], plan.parameters[call["name"]])
    except jsonschema.ValidationError:
        return False
    return True


def tool_calls_json(calls: list[dict], with_index: bool = False) -> list[dict]:
    """OpenAI's ``tool_calls``: an id each, ``function.arguments`` a JSON string."""
    out = []
    for i, call in enumerate(calls):
        entry = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call["name"],
                "arguments": json.dumps(call["arguments"], ensure_ascii=False),
            },
        }
        out.append({"index": i, **entry} if with_index else entry)
    return out
