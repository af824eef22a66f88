"""OpenAI request bodies -> what the executor takes. What each field does (mapped, refused with a 400
naming it unless at its default, or ignored because it cannot change the output) is one table,
`requests/field_table.py`; a name no engine here knows is logged and ignored, as vLLM does. ``user`` and
``metadata`` are checked and accepted (nothing is stored: there is no stored-completions API here).

Defaults follow OpenAI's API, not `SamplingParams`: ``temperature`` 1, ``max_tokens`` the rest of the
context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from ..executor.engine.inputs import InvalidRequestError, check_cache_salt, check_template_kwargs
from ..executor.engine.request import Prompt, Request
from ..sampling import SamplingParams
from ..tool_formats.native import chat_template_text
from .bad_request import BadRequest
from .requests.field_table import CHAT, COMPLETIONS
from .requests.fields import check_fields
from .requests.guided_fields import guided_format
from .tools import ToolPlan, parse_tools
from .tools import guided_format as tool_format

#: fields both endpoints map onto SamplingParams (same name, same meaning); ignore_eos, min_tokens and
#: stop_token_ids are vLLM's extensions
_SAMPLING_FIELDS = frozenset(
    {
        "ignore_eos",
        "min_tokens",
        "stop_token_ids",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
    }
)
#: what ``stream_options`` takes: OpenAI's include_usage and include_obfuscation, vLLM's
#: continuous_usage_stats (the usage so far in every chunk; guidellm sends it)
STREAM_OPTIONS = ("include_usage", "include_obfuscation", "continuous_usage_stats")
#: roles a chat message may have; OpenAI's ``developer`` is its newer name for ``system``
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_PROMPTS = 64  #: prompts in one /v1/completions request at most
MAX_LOGPROBS = 20  #: top alternatives per token at most (OpenAI's limit)
MAX_N = 16  #: samples per request at most


@dataclass(slots=True)
class ParsedRequest:
    """One OpenAI request, as the executor will run it."""

    requests: list[Request]  #: one per prompt: prompt, sampling params (n, logprobs...), response_format
    is_chat: bool
    stream: bool
    include_usage: bool  #: stream_options.include_usage: a last chunk with the usage
    num_top_logprobs: int | None  #: top alternatives per token in the response; None = no logprobs
    continuous_usage: bool = False  #: stream_options.continuous_usage_stats: the usage in every chunk
    obfuscation: bool = False  #: stream_options.include_obfuscation: random padding in every chunk
    user: str | None = None  #: the caller's end-user id (checked, logged; nothing is stored)
    echo: bool = False  #: completions: the prompt's text (and log-probabilities) before the completion
    #: each prompt as given, when it was text (echo returns it as sent); None for token ids
    prompt_texts: list[str | None] | None = None
    tool_plan: ToolPlan | None = None  #: chat with tools: how calls are made and read (`tools.py`)

    @property
    def request(self) -> Request:
        """The first (with one prompt, the only) request."""
        return self.requests[0]


def parse_chat(body: Any, max_model_len: int, template_reads_name: bool = False) -> ParsedRequest:
    """``template_reads_name``: the chat template renders a message's ``name`` (else a name is refused:
    it would be dropped)."""
    body = check_fields(_object(body), CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects", "messages")
    prompt = [_message(m, i, template_reads_name) for i, m in enumerate(messages)]
    max_tokens = _max_tokens(body)
    top = None
    if body.get("logprobs") is not None:
        if not isinstance(body["logprobs"], bool):
            raise BadRequest("logprobs must be true or false for chat completions", "logprobs")
        if body["logprobs"]:
            top = _int_in(body.get("top_logprobs", 0), "top_logprobs", 0, MAX_LOGPROBS)
    elif body.get("top_logprobs"):  # (0 without logprobs, as routers fill it in, asks for nothing)
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    prompt_top = None
    if body.get("prompt_logprobs") is not None:
        prompt_top = _int_in(body["prompt_logprobs"], "prompt_logprobs", 0, MAX_LOGPROBS)
        if body.get("stream"):
            raise BadRequest("prompt_logprobs are not streamed: send stream: false", "prompt_logprobs")
    plan = parse_tools(body)
    response_format = guided_format(body, CHAT)
    forced = tool_format(plan) if plan is not None else None
    if forced is not None:
        if response_format is not None:
            raise BadRequest("tool_choice required or a named function takes no output format", "tool_choice")
        response_format = forced
    parsed = _parsed(body, prompt, max_tokens, max_model_len, top, True, response_format, prompt_top)
    if plan is not None:
        parsed.tool_plan = plan
        parsed.requests = [replace(parsed.request, tools=plan.tools)]
    return parsed


def parse_completion(body: Any, max_model_len: int, template_reads_name: bool = False) -> ParsedRequest:
    body = check_fields(_object(body), COMPLETIONS)
    prompt = body.get("prompt")
    prompts = (
        prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt)
        else [prompt]
    )
    if len(prompts) > MAX_PROMPTS:
        raise BadRequest(f"at most {MAX_PROMPTS} prompts in one request, got {len(prompts)}", "prompt")
    for one in prompts:
        is_text = isinstance(one, str) and one
        is_ids = (
            isinstance(one, list) and one and all(isinstance(t, int) and not isinstance(t, bool) for t in one)
        )
        if not (is_text or is_ids):
            raise BadRequest(
                "prompt must be non-empty text, a list of token ids, or a list of those (one choice each)",
                "prompt",
            )
    top = None
    if body.get("logprobs") is not None:
        top = _int_in(body["logprobs"], "logprobs", 0, MAX_LOGPROBS)
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest("echo must be true or false", "echo")
    prompt_top = None
    if body.get("prompt_logprobs") is not None:
        prompt_top = _int_in(body["prompt_logprobs"], "prompt_logprobs", 0, MAX_LOGPROBS)
    if echo and top is not None:  # the prompt's tokens are listed with their log-probabilities
        prompt_top = max(top, prompt_top or 0)
    max_tokens = _max_tokens(body)  # (max_completion_tokens, the chat name, too: routers send it)
    if max_tokens == 0 and not echo and prompt_top is None:
        raise BadRequest(
            "max_tokens: 0 needs echo or prompt_logprobs (nothing would be returned)", "max_tokens"
        )
    if max_tokens == 0 and prompt_top is None:  # echo alone: the prompt's text is what comes back
        prompt_top = 0
    response_format = guided_format(body, COMPLETIONS)
    parsed = _parsed(body, prompts[0], max_tokens, max_model_len, top, False, response_format, prompt_top)
    params = parsed.request.sampling_params
    parsed.requests = [
        replace(parsed.request, prompt=one, sampling_params=replace(params)) for one in prompts
    ]
    parsed.echo = echo
    parsed.prompt_texts = [one if isinstance(one, str) else None for one in prompts]
    if len(prompts) > 1 and parsed.stream:
        raise BadRequest("stream: true takes one prompt", "prompt")
    if echo and parsed.stream and top is not None:  # (the prompt's log-probabilities come at the end)
        raise BadRequest("echo with logprobs is not streamed by this server: send stream: false", "echo")
    return parsed


def _parsed(
    body: dict,
    prompt: Prompt,
    max_tokens,
    max_model_len: int,
    top: int | None,
    is_chat: bool,
    response_format: dict | None,
    prompt_top: int | None = None,
) -> ParsedRequest:
    options: dict[str, Any] = {"temperature": 1.0}
    options.update({k: body[k] for k in _SAMPLING_FIELDS if body.get(k) is not None})
    if options.get("top_k") == -1:  # vLLM's "off"
        options["top_k"] = 0
    options["max_tokens"] = max_model_len if max_tokens is None else max_tokens
    if body.get("stop") is not None:
        options["stop"] = body["stop"]
    n = _int_in(body.get("n", 1), "n", 1, MAX_N)
    if n != 1:
        options["n"] = n
    if top is not None:
        options["logprobs"] = top
    if prompt_top is not None:
        options["prompt_logprobs"] = prompt_top
    if body.get("logit_bias") is not None:
        options["logit_bias"] = _logit_bias(body["logit_bias"])
    unknown = {k for k in options if k not in {f.name for f in fields(SamplingParams)}}
    if unknown:  # (a field this version's SamplingParams does not have yet)
        raise BadRequest(f"not supported by this server: {', '.join(sorted(unknown))}", sorted(unknown)[0])
    params = SamplingParams(**options)
    try:
        params.validate()
    except ValueError as exc:
        raise BadRequest(str(exc), _field_named(str(exc))) from exc
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", "stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - set(STREAM_OPTIONS):
        raise BadRequest(f"stream_options takes {', '.join(STREAM_OPTIONS)}", "stream_options")
    for name, value in stream_options.items():
        if not isinstance(value, bool):
            raise BadRequest(f"stream_options.{name} must be true or false", "stream_options")
    if stream_options and not stream:
        raise BadRequest("stream_options needs stream: true", "stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("user must be a string", "user")
    _check_metadata(body.get("metadata"))
    try:  # (the tenant's cache namespace: prefix-cache pages and drafter pools, `Request.cache_salt`)
        cache_salt = check_cache_salt(body.get("cache_salt"))
    except ValueError as exc:
        raise BadRequest(str(exc), "cache_salt") from exc
    request = Request(
        prompt, params, response_format=response_format, cache_salt=cache_salt, **_prompt_options(body)
    )
    return ParsedRequest(
        [request],
        is_chat,
        stream,
        bool(stream_options.get("include_usage")),
        top,
        continuous_usage=bool(stream_options.get("continuous_usage_stats")),
        obfuscation=bool(stream_options.get("include_obfuscation")),
        user=user,
    )


def _max_tokens(body: dict) -> Any:
    """OpenAI's max_completion_tokens or max_tokens, or llama.cpp's n_predict (-1: no bound)."""
    value = _first_set(body, "max_completion_tokens", "max_tokens")
    if value is None and body.get("n_predict") is not None:
        value = None if body["n_predict"] == -1 else body["n_predict"]
    return value


def _prompt_options(body: dict) -> dict:
    """How the prompt is tokenized: vLLM's add_special_tokens and chat_template_kwargs."""
    special = body.get("add_special_tokens")
    if special is not None and not isinstance(special, bool):
        raise BadRequest("add_special_tokens must be true or false", "add_special_tokens")
    try:
        kwargs = check_template_kwargs(body.get("chat_template_kwargs"))
    except InvalidRequestError as exc:
        raise BadRequest(str(exc), "chat_template_kwargs") from exc
    return {"add_special_tokens": special, "chat_template_kwargs": kwargs}


def _logit_bias(value: Any) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` (JSON keys are strings) -> {id: bias}; ranges are checked by
    SamplingParams, the ids against the vocabulary by the executor."""
    if not isinstance(value, dict):
        raise BadRequest('logit_bias must be an object {"token id": bias in -100..100}', "logit_bias")
    bias = {}
    for key, add in value.items():
        try:
            token = int(key)
        except ValueError:
            raise BadRequest(f"logit_bias: {key!r} is not a token id", "logit_bias") from None
        if isinstance(add, bool) or not isinstance(add, (int, float)):
            raise BadRequest(f"logit_bias: the bias of {key} must be a number in -100..100", "logit_bias")
        bias[token] = float(add)
    return bias


def _check_metadata(metadata: Any) -> None:
    """OpenAI's limits: at most 16 pairs of strings, keys up to 64 characters, values up to 512."""
    if metadata is None:
        return
    if (
        not isinstance(metadata, dict)
        or len(metadata) > 16
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
        or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items())
    ):
        raise BadRequest(
            "metadata must be an object of at most 16 string pairs (keys up to 64 characters, values up to 512)",
            "metadata",
        )


def _first_set(body: dict, *names: str) -> Any:
    """The value of the first of ``names`` the body sets to something other than null."""
    return next((body[n] for n in names if body.get(n) is not None), None)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _message(message: Any, i: int, template_reads_name: bool) -> dict:
    if not isinstance(message, dict) or "role" not in message:
        raise BadRequest(f"messages[{i}] must be an object with role and content", "messages")
    extra = set(message) - {"role", "content", "name", "tool_calls", "tool_call_id"}
    if extra:
        raise BadRequest(
            f"messages[{i}]: not supported by this server: {', '.join(sorted(extra))}", "messages"
        )
    role = ROLES.get(message["role"]) if isinstance(message["role"], str) else None
    if role is None:
        raise BadRequest(
            f"messages[{i}].role must be one of {', '.join(ROLES)}, got {message['role']!r}", "messages"
        )
    name = message.get("name")
    if name is not None and not (isinstance(name, str) and template_reads_name):
        why = (
            "must be a string"
            if not isinstance(name, str)
            else "is not rendered by this model's chat template"
        )
        raise BadRequest(f"messages[{i}].name {why}", "messages")
    calls, call_id = message.get("tool_calls"), message.get("tool_call_id")
    if calls is not None and (role != "assistant" or not _calls_ok(calls)):
        raise BadRequest(
            f"messages[{i}].tool_calls: an assistant's list of "
            '{"id", "type": "function", "function": {"name", "arguments": a JSON string}}',
            "messages",
        )
    if (role == "tool") != isinstance(call_id, str):
        raise BadRequest(
            f"messages[{i}]: a tool message, and only one, has a tool_call_id string", "messages"
        )
    content = message.get("content")
    if content is None and calls:  # an assistant's turn that only called tools
        content = ""
    if isinstance(content, list):  # content parts: text only
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")
    out = {"role": role, "content": content} | ({"name": name} if name is not None else {})
    if calls:
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = call_id
    return out


def _calls_ok(calls: Any) -> bool:
    return isinstance(calls, list) and all(
        isinstance(c, dict)
        and c.get("type", "function") == "function"
        and isinstance(c.get("function"), dict)
        and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments"), str)
        for c in calls
    )


def template_reads_name(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a message's ``name`` (``message.name`` or
    ``message['name']``)."""
    template = chat_template_text(tokenizer)
    return re.search(r"message(\.name\b|\[\s*['\"]name['\"]\s*\])", template) is not None


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer in {low}..{high}, got {value!r}", name)
    return value


def _field_named(message: str) -> str | None:
    """The field a SamplingParams error names (its messages start with the field's name)."""
    head = message.split(" ", 1)[0]
    return head if head.isidentifier() else None
