"""Tool calls streamed as they are generated, in OpenAI's delta shape: a call's first delta carries its
``index``, ``id``, ``type`` and ``function.name`` (with ``arguments: ""``), the next ones pieces of
``function.arguments`` as the model writes them; joined, the pieces are the call's arguments JSON.

- ``required`` or a named function (guided): the output is the calls' JSON, held to it by the grammar.
  A call is announced once its name is written, and its arguments stream from their first character.
- ``auto``: text streams as content up to a ``<tool_call>`` block (the opener is held back while it may
  still be one); a block is read when it closes, as the full response reads it (`tools.read_calls`),
  and sent as one call, or as content when it names no tool or its arguments do not validate.

The whole text is rescanned at each event (an answer is a few thousand characters at most).
"""

from __future__ import annotations

import json
import re
import uuid

from .tools import HERMES_CALL, MAX_PARALLEL_CALLS, ToolPlan, read_calls

#: the head of one call object, up to where its arguments' value begins
CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]+)"\s*,\s*"arguments"\s*:\s*')
OPENER = "<tool_call>"
SCALAR = re.compile(r"[^,}\]\s]+")  #: a number, true, false or null


class ToolCallStream:
    """One sample's stream: feed it the text so far, get the deltas to send."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.content_sent = 0  #: characters of content sent (auto)
        self.blocks_read = 0  #: Hermes blocks already read (auto)
        self.calls: list[dict] = []  #: per call sent: its id, name, and arguments characters sent
        self.scan_from = 0  #: (auto) where the text after the last block read begins

    def feed(self, piece: str) -> list[dict]:
        """The deltas the text gained by ``piece`` gives."""
        self.text += piece
        return self._guided() if self.plan.is_guided else self._auto(final=False)

    def finish(self) -> list[dict]:
        """What is left once the sample ended: (auto) held-back text and an unclosed block, as content."""
        return [] if self.plan.is_guided else self._auto(final=True)

    @property
    def made_calls(self) -> bool:
        return bool(self.calls)

    # ---- guided: the calls' JSON ----------------------------------------------------------------
    def _guided(self) -> list[dict]:
        deltas, at = [], 0
        for index in range(MAX_PARALLEL_CALLS):  # (the grammar's bound on a list of calls)
            head = CALL_HEAD.search(self.text, at)
            if head is None:
                break
            end = value_end(self.text, head.end())
            arguments = self.text[head.end() : end if end is not None else len(self.text)]
            deltas += self._call_deltas(index, head.group(1), arguments)
            if end is None:
                break
            at = end
        return deltas

    def _call_deltas(self, index: int, name: str, arguments: str) -> list[dict]:
        deltas = []
        if index == len(self.calls):  # announced with its name
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "name": name, "sent": 0}
            self.calls.append(call)
            first = {"index": index, "id": call["id"], "type": "function"}
            deltas.append({**first, "function": {"name": name, "arguments": ""}})
        call = self.calls[index]
        if len(arguments) > call["sent"]:
            deltas.append({"index": index, "function": {"arguments": arguments[call["sent"] :]}})
            call["sent"] = len(arguments)
        return deltas

    # ---- auto: text with Hermes blocks ----------------------------------------------------------
    def _auto(self, final: bool) -> list[dict]:
        deltas: list[dict] = []
        while True:
            opener = self.text.find(OPENER, self.scan_from)
            if opener < 0:
                # text up to a possible opener's start is content
                safe = len(self.text) if final else _held_back(self.text, self.scan_from)
                deltas += self._content(safe)
                return deltas
            deltas += self._content(opener)
            block = HERMES_CALL.match(self.text, opener)
            closed = (
                block is not None
                and self.text[block.end() - len("</tool_call>") : block.end()] == "</tool_call>"
            )
            if not closed and not final:
                return deltas
            end = block.end() if block is not None else len(self.text)
            _, calls = read_calls(self.plan, self.text[opener:end])
            if calls and (self.plan.parallel or not self.calls):
                for call in calls[:1]:
                    arguments = json.dumps(call["arguments"], ensure_ascii=False)
                    deltas += self._call_deltas(len(self.calls), call["name"], arguments)
                self.content_sent = end
            else:  # not a call: content, as the full response has it
                deltas += self._content(end)
            self.scan_from = end
            if final and not closed:
                return deltas

    def _content(self, upto: int) -> list[dict]:
        start = max(self.content_sent, 0)
        if upto <= start:
            return []
        piece = self.text[start:upto]
        self.content_sent = upto
        return [{"content": piece}]


def _held_back(text: str, start: int) -> int:
    """Where content may safely end: before a tail of ``text`` that could begin ``<tool_call>``."""
    for keep in range(min(len(OPENER) - 1, len(text) - start), 0, -1):
        if OPENER.startswith(text[len(text) - keep :]):
            return len(text) - keep
    return len(text)


def value_end(text: str, start: int) -> int | None:
    """One past the end of the JSON value starting at ``text[start]`` (whitespace before it skipped),
    or None while it is still open."""
    i, n = start, len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    if i == n:
        return None
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] not in "{[":
        match = SCALAR.match(text, i)
        end = match.end() if match else i
        return end if end < n else None
    depth = 0
    while i < n:
        c = text[i]
        if c == '"':
            close = _string_end(text, i)
            if close is None:
                return None
            i = close
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _string_end(text: str, i: int) -> int | None:
    """One past the closing quote of the string opening at ``text[i]``, or None while open."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None
