"""The checks the field table (`field_table.py`) asks for: a body's refused fields raised as a 400
naming the field, its ignored and unknown fields dropped (each name logged once), the rest kept for the
parser (`protocol.py`, `guided_fields.py`, `responses_api.py`).

A name in no row is logged once and ignored, as vLLM does (``extra="allow"``): a client or router
sending a field no engine here reads still gets its answer. Keys inside ``structured_outputs`` and
``response_format`` have rows of their own (``structured_outputs.regex``); an unknown key there is a 400,
since the object it is in asks for an output format.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..bad_request import BadRequest
from .field_table import ENDPOINTS, FIELDS, Action, Field

logger = logging.getLogger("specexec.server")


def rules_for(endpoint: str) -> dict[str, Field]:
    """{field name: its row} on one endpoint."""
    return {f.name: f for f in FIELDS if endpoint in f.endpoints}


_RULES = {endpoint: rules_for(endpoint) for endpoint in ENDPOINTS}
_logged: set[str] = set()


def check_fields(body: dict, endpoint: str) -> dict:
    """``body`` with its refused fields raised (a 400 naming the field) and only what the parser reads
    kept: mapped fields and checked ignored ones; other ignored and unknown fields are dropped, each name
    logged once."""
    rules = _RULES[endpoint]
    kept = {}
    for name, value in body.items():
        row = rules.get(name)
        if row is None:
            log_unknown(name)
        elif row.action is Action.MAPPED or row.is_checked:
            kept[name] = value
        elif row.action is Action.DEFAULT_ONLY:
            check_default(row, value)
        elif value is not None:
            _log_once(name, "request field %r cannot change the output here: ignored (logged once)")
    return kept


def check_object(name: str, value: Any, endpoint: str) -> dict:
    """The keys of the object field ``name`` the parser reads (rows ``name.key``); a key with no row is a
    400 naming the field, a default-only key at another value too."""
    param = name.split(".")[0]  # (the request's field, for a key nested deeper)
    if not isinstance(value, dict):
        raise BadRequest(f"{name} must be an object", param)
    rules = _RULES[endpoint]
    kept = {}
    for key, inner in value.items():
        row = rules.get(f"{name}.{key}")
        if row is None:
            known = sorted(k.removeprefix(f"{name}.") for k in rules if k.startswith(f"{name}."))
            raise BadRequest(f"{name}.{key} is not read by this server (it reads {', '.join(known)})", param)
        if row.action is Action.MAPPED:
            kept[key] = inner
        elif row.action is Action.DEFAULT_ONLY:
            check_default(row, inner, param)
    return kept


def check_default(row: Field, value: Any, param: str | None = None) -> None:
    """A default-only field's value: null, one of its accepted values, or an object of nulls (such as
    ``reasoning: {"effort": null}``: nothing asked); else a 400 naming it."""
    if value is None or (isinstance(value, dict) and value and all(v is None for v in value.values())):
        return
    if not any(_same(value, a) for a in row.accepted):
        shown = " or ".join(json.dumps(a) for a in row.accepted + (None,))
        raise BadRequest(f"{row.name} is not supported by this server (only {shown})", param or row.name)


def log_unknown(name: str) -> None:
    """Log, once per name, that a request field is ignored."""
    _log_once(name, "request field %r is not known to this server: ignored (logged once)")


def _log_once(name: str, message: str) -> None:
    if name not in _logged:
        _logged.add(name)
        logger.warning(message, name)


def _same(value: Any, allowed: Any) -> bool:
    """Equal, and a JSON boolean only to a boolean (``true`` is not ``1``)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    return value == allowed
