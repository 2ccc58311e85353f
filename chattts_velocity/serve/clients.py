"""Serving stage: who a request is from, told apart by what a client cannot choose, and what each may hold.

Keyless, a client is its peer address (the TCP connection's), or, when the peer is a proxy the operator named
(`trusted_proxies`), the address that proxy put in X-Forwarded-For: the right-most entry that is not itself a
trusted proxy. A bearer token on a keyless server names nobody. With API keys (`api_key`, or a keys file of one key
a line with optional limits), a request is from (its key, its peer): each peer takes its own turns and has its own
cap, and a key may also cap all its peers together.

The identity becomes the engine's CLIENT (whose turn) and QUOTAS (which counters a request counts against, each
with its cap: engine/client_quota.py); the counters live while a client has work and are dropped at zero.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.types import Scope

from ..engine.client_quota import ALL_PEERS, Quotas

KEY_LIMITS = ("max_queued", "max_queued_per_peer")  # the limits a keys-file line may set (NAME=N)


@dataclass(frozen=True)
class KeyLimits:
    """One API key's limits; None keeps the server's."""

    max_queued: int | None = None  # unfinished pieces of all the key's peers together (None: no cap of its own)
    max_queued_per_peer: int | None = None  # unfinished pieces of one peer using the key (None: max_queued_per_client)


@dataclass(frozen=True)
class Client:
    name: str  # whose turn: "addr:PEER", or "key:DIGEST/addr:PEER"
    quotas: Quotas  # (counter, cap) pairs its engine requests count against
    authorized: bool = True  # False: a keyed server, and the request holds none of its keys


def read_keys_file(path: str | Path) -> dict[str, KeyLimits]:
    """`KEY [max_queued=N] [max_queued_per_peer=N]` a line; blank lines and `#` comments skipped. A bad line is a
    ValueError naming the file and line (never echoing a key)."""
    keys: dict[str, KeyLimits] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"api_keys_file: cannot read {path} ({exc})") from None
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        limits: dict[str, int] = {}
        for word in words[1:]:
            name, _, value = word.partition("=")
            if name not in KEY_LIMITS or not value.isdigit() or int(value) < 1 or name in limits:
                raise ValueError(f"api_keys_file: {path} line {number}: expected KEY followed by any of "
                                 f"{', '.join(n + '=N' for n in KEY_LIMITS)} (N >= 1), once each")
            limits[name] = int(value)
        if words[0] in keys:
            raise ValueError(f"api_keys_file: {path} line {number}: a key given twice")
        keys[words[0]] = KeyLimits(**limits)
    if not keys:
        raise ValueError(f"api_keys_file: {path} holds no key")
    return keys


class Clients:
    """The server's API keys and trusted proxies; authorizes and identifies each request."""

    def __init__(self, keys: Mapping[str, KeyLimits], max_queued_per_client: int | None,
                 trusted_proxies: tuple[str, ...] = ()) -> None:
        self._keys = [(key.encode(), _digest(key), limits) for key, limits in keys.items()]
        self.max_queued_per_client = max_queued_per_client
        self.trusted = frozenset(_address(p, "trusted_proxies") for p in trusted_proxies)

    @property
    def keyed(self) -> bool:
        return bool(self._keys)

    def key_of(self, headers: Mapping[str, str]) -> tuple[str, KeyLimits] | None:
        """(the key's digest, its limits) for a request carrying one of the server's keys, else None. Every key is
        compared (in constant time each), so the time taken does not tell which one matched."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        given = token.strip().encode() if scheme.lower() == "bearer" else b""
        found = None
        for key, digest, limits in self._keys:
            if hmac.compare_digest(given, key) and found is None:
                found = (digest, limits)
        return found

    def identify(self, scope: Scope, headers: Mapping[str, str]) -> Client:
        """Who the request is from; on a keyed server a request without one of its keys is its peer, unauthorized."""
        peer = "addr:" + self.peer(scope, headers)
        cap = self.max_queued_per_client
        key = self.key_of(headers) if self._keys else None
        if key is None:
            return Client(peer, () if cap is None else ((peer, cap),), authorized=not self._keys)
        digest, limits = key
        name = f"key:{digest}/{peer}"
        per_peer = limits.max_queued_per_peer or cap
        quotas = (() if per_peer is None else ((name, per_peer),)) + (
            () if limits.max_queued is None else ((f"key:{digest}{ALL_PEERS}", limits.max_queued),))
        return Client(name, quotas)

    def peer(self, scope: Scope, headers: Mapping[str, str]) -> str:
        """The connection's peer address, or the client address a trusted proxy forwarded."""
        host = (scope.get("client") or ("",))[0] or ""
        host = _address(host, None) or host
        if host not in self.trusted or "x-forwarded-for" not in headers:
            return host
        for hop in reversed(headers["x-forwarded-for"].split(",")):  # right to left: the nearest proxy's first
            address = _address(hop, None)
            if not address:
                return host  # not an address: nothing left of it can be trusted either
            if address not in self.trusted:
                return address
        return host


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _address(text: str, field: str | None) -> str:
    """An IP address in its normal spelling; with `field`, a bad one is a ValueError naming it, else ''."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        if field is not None:
            raise ValueError(f"{field}: {text!r} is not an IP address") from None
        return ""
