"""Who may do what: the API keys (any one of them opens the API), who may call the admin endpoints
(``/flush_cache``, ``/reset_prefix_cache``), and whose a stored response is.

- With keys set, every endpoint but ``/health`` and ``/metrics`` needs one (``Authorization: Bearer
  KEY``), the admin endpoints too. With none, the admin endpoints answer loopback clients only (a 403
  for others) unless the server was started with ``allow_remote_admin`` (``--allow-remote-admin``).
- A stored response belongs to the key that made it: its owner is the key's identity, a SHA-256 digest
  (the key itself is never stored), and another key's GET, DELETE or ``previous_response_id`` of it is
  answered as for an id never stored. Without keys every client is the same owner. ``user`` is not an
  owner: any client may write any ``user``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Sequence

from fastapi import Request

from ..bad_request import HTTPError

ANONYMOUS = ""  #: the owner of everything a server without keys stores


class Access:
    def __init__(self, api_keys: str | Sequence[str] | None, allow_remote_admin: bool = False) -> None:
        keys = [api_keys] if isinstance(api_keys, str) else list(api_keys or [])
        self._keys = [k.encode() for k in keys]
        self.allow_remote_admin = allow_remote_admin

    @property
    def has_keys(self) -> bool:
        return bool(self._keys)

    def check_key(self, request: Request) -> str:
        """The caller's owner identity (`key_identity`, or `ANONYMOUS` without keys); a 401 without a
        valid key where keys are set."""
        if not self._keys:
            return ANONYMOUS
        given = request.headers.get("authorization", "")
        token = given[len("Bearer ") :].encode() if given.startswith("Bearer ") else b""
        if not any(hmac.compare_digest(token, key) for key in self._keys):  # (every key, always)
            raise HTTPError(
                401,
                "missing or wrong API key (Authorization: Bearer ...)",
                "authentication_error",
                code="invalid_api_key",
            )
        return key_identity(token)

    def check_admin(self, request: Request) -> None:
        """An admin endpoint's caller: a valid key where keys are set; else a loopback client (or any,
        with ``allow_remote_admin``), a 403 for others."""
        if self._keys:
            self.check_key(request)
        elif not (self.allow_remote_admin or is_loopback(request)):
            raise HTTPError(
                403,
                "this endpoint changes the server's state: without an API key it answers loopback "
                "clients only (start the server with --api-key, or --allow-remote-admin)",
                "permission_error",
                code="admin_needs_key",
            )


def key_identity(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:32]


def is_loopback(request: Request) -> bool:
    """The client is this machine: a loopback address (127.0.0.0/8, ::1, IPv4-mapped too) or a Unix
    socket (no address). Behind a proxy uvicorn trusts (``--forwarded-allow-ips``), the forwarded one."""
    client = request.client
    if client is None or not client.host:
        return True
    try:
        address = ipaddress.ip_address(client.host)
    except ValueError:
        return False  # (a name, such as a test client's "testclient")
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
