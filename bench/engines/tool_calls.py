"""The tool-call workload (``--tool-choice required``): each prompt sent as a chat request with its
tools and ``tool_choice: required``, as `specexec serve` runs one. The output is held to the calls'
JSON schema (`server/tools.py`'s `guided_format`: a call, or a list of them where the prompt expects
several), so the ``valid`` column is the share of answers whose calls all parse and validate against
their functions' parameters."""

from __future__ import annotations

from dataclasses import replace

from ...prompt_sets.datasets import BenchPrompt
from ...server.tools import guided_format, parse_tools


def tool_call_prompts(prompts: list[BenchPrompt], dataset: str) -> list[BenchPrompt]:
    """The prompts as tool-call requests: their own messages (without the text that stands in for
    tools), their tools, and the schema of the calls ``tool_choice: required`` allows."""
    out = []
    for prompt in prompts:
        if not prompt.tools or prompt.tool_messages is None:
            raise ValueError(f"--tool-choice needs prompts with tools (bfcl); {dataset!r} has none")
        body = {
            "tools": prompt.tools,
            "tool_choice": "required",
            "parallel_tool_calls": prompt.parallel_calls,
        }
        schema = guided_format(parse_tools(body))["json_schema"]["schema"]
        out.append(replace(prompt, messages=prompt.tool_messages, schema=schema))
    return out
