"""Request fields this server does not map, as vLLM's and SGLang's clients and routers send them.

A router in front of several replicas re-writes the body it forwards: sglang-router adds SGLang's
sampling fields at their defaults, and clients written for vLLM send its extensions. A field is one of:

- mapped (`protocol.py`): it does what its name says;
- **default-only** (`DEFAULT_ONLY`): a field of OpenAI's, vLLM's or SGLang's whose other values would
  change what comes back in a way this server cannot do (beam search, guided decoding by regex, a
  LoRA adapter). At its default, or null, it is accepted; any other value is a 400 naming it;
- unknown: logged once per name and ignored, as vLLM does (`extra="allow"` on its request models),
  so a client or router sending a field no engine here reads still gets its answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .bad_request import BadRequest

logger = logging.getLogger("specexec.server")

#: field -> the values it may take here (None, JSON null, is always accepted): each is the field's
#: default where OpenAI, vLLM or SGLang define it, the only behaviour this server has
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    # OpenAI
    "best_of": (1,),
    "suffix": ("",),
    "service_tier": ("auto", "default"),
    "store": (False,),
    "prediction": (),
    "audio": (),
    "modalities": (["text"],),
    "web_search_options": (),
    "reasoning_effort": (),
    "functions": (),
    "function_call": ("none", "auto"),
    # vLLM
    "use_beam_search": (False,),
    "length_penalty": (1.0,),
    "early_stopping": (False,),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "guided_decoding_backend": (),
    "structural_tag": (),
    "echo": (False,),  #: (chat: vLLM's echo of the last message; completions map their own)
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "documents": (),
    "chat_template": (),
    "mm_processor_kwargs": (),
    "prompt_embeds": (),
    "lora_request": (),
    "return_tokens_as_token_ids": (False,),
    "kv_transfer_params": (),
    # SGLang
    "regex": (),
    "ebnf": (),
    "no_stop_trim": (False,),
    "lora_path": (),
    "return_hidden_states": (False,),
    "session_params": (),
}
#: vLLM's and SGLang's names for a JSON schema to follow, mapped onto ``response_format``
SCHEMA_FIELDS = ("guided_json", "json_schema")

_logged: set[str] = set()


def check_foreign_fields(body: dict, mapped: frozenset[str]) -> dict:
    """``body`` with what this server cannot honour refused (a 400 naming the field), the schema
    fields mapped onto ``response_format``, and unknown fields dropped (each logged once)."""
    kept = {name: value for name, value in body.items() if name in mapped}
    for name, value in body.items():
        if name in mapped or value is None:
            continue
        if name in DEFAULT_ONLY:
            allowed = DEFAULT_ONLY[name]
            if not any(_same(value, a) for a in allowed):
                shown = " or ".join(json.dumps(a) for a in allowed + (None,))
                raise BadRequest(f"{name} is not supported by this server (only {shown})", name)
        elif name in SCHEMA_FIELDS:
            kept["response_format"] = _schema_format(name, value, kept.get("response_format"))
        else:
            log_unknown(name)
    return kept


def log_unknown(name: str) -> None:
    """Log, once per name, that a request field is ignored."""
    if name not in _logged:
        _logged.add(name)
        logger.warning("request field %r is not known to this server: ignored (logged once)", name)


def _same(value: Any, allowed: Any) -> bool:
    """Equal, and a JSON boolean only to a boolean (``true`` is not ``1``)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return value == allowed


def _schema_format(name: str, value: Any, response_format: Any) -> dict:
    if response_format not in (None, {"type": "text"}):
        raise BadRequest(f"{name} and response_format both set an output format: send one", name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadRequest(f"{name} must be a JSON schema (an object, or its JSON text)", name) from None
    if not isinstance(value, dict):
        raise BadRequest(f"{name} must be a JSON schema (an object, or its JSON text)", name)
    return {"type": "json_schema", "json_schema": {"name": name, "schema": value}}
