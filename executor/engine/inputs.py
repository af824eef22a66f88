"""Turns what users submit into token ids, with a clear error for each bad request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...tool_formats import hermes, native
from .request import MAX_CACHE_SALT_CHARS, Prompt, Request

CHAT_ROLES = ("system", "user", "assistant", "tool")


class InvalidRequestError(ValueError):
    """This request cannot run; the others in the same call go on."""


def as_request(item: Request | Prompt, default_params) -> Request:
    if isinstance(item, Request):
        return item
    return Request(prompt=item, sampling_params=default_params)


def check_cache_salt(cache_salt: Any) -> str | None:
    """The request's ``cache_salt`` as given: None, or a string of 1..`MAX_CACHE_SALT_CHARS` characters
    (an empty salt would look like a namespace of its own and is more likely a client's bug)."""
    if cache_salt is None or (isinstance(cache_salt, str) and 1 <= len(cache_salt) <= MAX_CACHE_SALT_CHARS):
        return cache_salt
    shown = type(cache_salt).__name__ if not isinstance(cache_salt, str) else f"{len(cache_salt)} characters"
    raise InvalidRequestError(
        f"cache_salt must be a string of 1..{MAX_CACHE_SALT_CHARS} characters, got {shown}"
    )


def _check_messages(messages: Sequence[Any]) -> None:
    for i, message in enumerate(messages):
        has_calls = isinstance(message, dict) and bool(message.get("tool_calls"))
        if (
            not isinstance(message, dict)
            or "role" not in message
            or ("content" not in message and not has_calls)
        ):
            raise InvalidRequestError(f"chat message {i} must be a dict with 'role' and 'content'")
        if message["role"] not in CHAT_ROLES:
            raise InvalidRequestError(
                f"chat message {i} has unknown role {message['role']!r}; allowed: {', '.join(CHAT_ROLES)}"
            )


#: what `apply_chat_template` takes itself (and the template's ``messages``): not a template variable
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def check_template_kwargs(kwargs: Any) -> dict[str, Any] | None:
    """A request's ``chat_template_kwargs``: None, or an object of template variables (names that
    `apply_chat_template` takes itself are refused: they would change how it renders, not what)."""
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidRequestError("chat_template_kwargs must be an object of template variables")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise InvalidRequestError(f"chat_template_kwargs cannot set {', '.join(reserved)}")
    return kwargs


def _render_chat(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict] | None = None,
    add_special_tokens: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The messages through the chat template; ``add_special_tokens`` also tokenizes the rendered text
    with the tokenizer's special tokens (BOS...), which the template's own text usually has already."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError("chat messages need a tokenizer with a chat template; this model has none")
    _check_messages(messages)
    from jinja2 import TemplateError

    extra = dict(check_template_kwargs(template_kwargs) or {})
    if tools or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        if native.template_renders_tools(tokenizer):
            messages = native.prompt_messages(messages)
            extra.update({"tools": tools} if tools else {})
        else:  # the Hermes format as text (`tool_formats/hermes.py`)
            messages = hermes.prompt_messages(messages, tools)
    try:
        rendered = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=not add_special_tokens, **extra
        )
    except TemplateError as exc:  # a template's raise_exception(...), e.g. roles out of order
        raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from exc
    if add_special_tokens:
        return list(tokenizer(rendered, add_special_tokens=True)["input_ids"])
    if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
        rendered = rendered["input_ids"]
    return list(rendered)


def tokenize_prompt(
    prompt: Prompt,
    tokenizer,
    vocab_size: int,
    tools: list[dict] | None = None,
    *,
    add_special_tokens: bool | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a prompt given as text, token ids or chat messages (with ``tools``: see
    `tool_formats/`). ``add_special_tokens``: with the tokenizer's special tokens (None: for text yes,
    for chat no: the template writes its own); ``template_kwargs``: the chat template's extra variables
    (`Request.add_special_tokens`, `Request.chat_template_kwargs`). Token ids are taken as given."""
    if tools is not None and not (
        isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt)
    ):
        raise InvalidRequestError("tools need a chat prompt (a list of messages)")
    ids = _tokenize(prompt, tokenizer, tools, add_special_tokens, template_kwargs)
    if not ids:
        raise InvalidRequestError("prompt is empty after tokenization")
    check_token_ids(ids, vocab_size)
    return ids


def _tokenize(
    prompt: Prompt,
    tokenizer,
    tools: list[dict] | None,
    add_special_tokens: bool | None,
    template_kwargs: dict[str, Any] | None,
) -> list[int]:
    if add_special_tokens is not None and not isinstance(add_special_tokens, bool):
        raise InvalidRequestError(f"add_special_tokens must be a bool, got {add_special_tokens!r}")
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("empty prompt")
        if tokenizer is None:
            raise InvalidRequestError("a text prompt needs a tokenizer; pass token ids instead")
        return list(tokenizer(prompt, add_special_tokens=add_special_tokens is not False)["input_ids"])
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise InvalidRequestError(
            "prompt must be non-empty text, a list of token ids or a list of chat messages, "
            f"got {type(prompt).__name__} {prompt!r:.60}"
        )
    if all(isinstance(t, dict) for t in prompt):
        return _render_chat(tokenizer, list(prompt), tools, bool(add_special_tokens), template_kwargs)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise InvalidRequestError("a list prompt must hold only token ids (int) or only chat messages (dict)")
    return list(prompt)


def check_token_ids(ids, vocab_size: int, what: str | None = None) -> None:
    """Refuse token ids outside the vocabulary (``what``: the request's field naming them, if not the
    prompt)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        field = f"{what}: " if what else ""
        raise InvalidRequestError(f"{field}token ids outside the vocabulary 0..{vocab_size - 1}: {bad[:5]}")


def check_length(num_prompt_tokens: int, max_model_len: int) -> None:
    if num_prompt_tokens >= max_model_len:
        raise InvalidRequestError(
            f"prompt has {num_prompt_tokens} tokens; the context holds {max_model_len}, "
            "with room for at least one output token"
        )
