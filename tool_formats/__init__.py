"""Tool-call formats, one module each, that module alone writing the format into a prompt and reading
calls back out of an output (whole, and as it is generated):

- `hermes.py`: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks, for a chat template
  with no place for tools, and read from any model's output under ``tool_choice: auto``;
- `json_calls.py`: the bare call objects a guided choice (``required``, a named function) is held to;
- `native.py`: the chat template's own rendering of ``tools`` (writing only: its models answer in Hermes).

A leaf: it imports nothing of ours. The executor renders prompts with it (`executor/engine/inputs.py`),
the server reads answers with it (`server/tools.py`, `server/tool_stream.py`).
"""
