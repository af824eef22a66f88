"""Tool calls streamed as they are generated, in OpenAI's delta shape: a call's first delta carries its
``index``, ``id``, ``type`` and ``function.name`` (with ``arguments: ""``), the next ones pieces of
``function.arguments`` as the model writes them; joined, the pieces are the call's arguments JSON.
Where the calls are in the text the format modules say (`tool_formats/`); this module makes the deltas.

- ``required`` or a named function (guided): the output is the calls' JSON, held to it by the grammar
  (`json_calls.calls_so_far`). A call is announced once its name is written, and its arguments stream
  from their first character.
- ``auto``: text streams as content up to a ``<tool_call>`` block (the opener is held back while it may
  still be one: `hermes.StreamReader`); a block is read when it closes, as the full response reads it
  (`tools.read_calls`), and sent as one call, or as content when it names no tool or its arguments do
  not validate.

The whole text is rescanned at each event (an answer is a few thousand characters at most).
"""

from __future__ import annotations

import json
import uuid

from ..tool_formats import hermes, json_calls
from .tools import MAX_PARALLEL_CALLS, ToolPlan, read_calls


class ToolCallStream:
    """One sample's stream: feed it the text so far, get the deltas to send."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.content_sent = 0  #: characters of content sent (auto)
        self.calls: list[dict] = []  #: per call sent: its id, name, and arguments characters sent
        self.reader = hermes.StreamReader()  #: (auto) the text's plain spans and blocks

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
        deltas = []
        for index, (name, arguments) in enumerate(json_calls.calls_so_far(self.text, MAX_PARALLEL_CALLS)):
            deltas += self._call_deltas(index, name, arguments)
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
        for span in self.reader.read(self.text, final):
            if isinstance(span, hermes.Plain):
                deltas += self._content(span.end)
                continue
            _, calls = read_calls(self.plan, self.text[span.start : span.end])
            if calls and (self.plan.parallel or not self.calls):
                for call in calls[:1]:
                    arguments = json.dumps(call["arguments"], ensure_ascii=False)
                    deltas += self._call_deltas(len(self.calls), call["name"], arguments)
                self.content_sent = span.end
            else:  # not a call: content, as the full response has it
                deltas += self._content(span.end)
        return deltas

    def _content(self, upto: int) -> list[dict]:
        start = max(self.content_sent, 0)
        if upto <= start:
            return []
        piece = self.text[start:upto]
        self.content_sent = upto
        return [{"content": piece}]
