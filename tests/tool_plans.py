"""The plan the server makes of a request's tools (`specexec.server.tools.parse_tools`), for the tool-call
tests."""

from __future__ import annotations

from specexec.server.tools import parse_tools


def tool_plan(tools: list[dict], choice="auto", parallel=True):
    return parse_tools({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel})
