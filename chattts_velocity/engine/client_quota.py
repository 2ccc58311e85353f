"""Engine stage: who a request is from and how many unfinished requests each client may have.

A request made in an asyncio context carries that context's CLIENT (whose turn it is when seats free up: the
scheduler's fairness key) and QUOTAS (the counters it counts against, each with its cap). The server's edge sets
both per HTTP request: a peer's counter, and on a keyed server the key's over all its peers as well.
"""
from __future__ import annotations

import contextvars
from collections import Counter

# who the current request is from (the server's edge sets it per HTTP request); admission takes turns between them
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("chattts_velocity_client", default="")
Quotas = tuple[tuple[str, int], ...]  # (counter name, cap) pairs
ALL_PEERS = "/*"  # the end of a counter shared by every client of one API key ("key:DIGEST/*")
# the current request's quotas; None: one counter named by CLIENT, capped at the engine's max_queued_per_client
QUOTAS: contextvars.ContextVar[Quotas | None] = contextvars.ContextVar("chattts_velocity_quotas", default=None)


class ClientBusy(ValueError):
    """A client already has as many requests unfinished as it may; the server answers 429 with Retry-After."""

    code = "rate_limit_exceeded"
    status = 429
    retry_after = 1  # seconds


def current_quotas(default_cap: int | None) -> Quotas:
    """The quotas of a request made in the caller's context."""
    quotas, client = QUOTAS.get(), CLIENT.get()
    if quotas is not None:
        return quotas
    return ((client, default_cap),) if client and default_cap is not None else ()


class QuotaBook:
    """Unfinished requests by quota counter, and the counters each request holds. A counter back at zero is
    dropped, so a client that has gone leaves no record. Written by one thread; busy() may be read from another
    (a dict read: at worst one step stale)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._held: dict[str, tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def busy(self, quotas: Quotas) -> ClientBusy | None:
        """The refusal a new request with these quotas gets now, or None."""
        for name, cap in quotas:
            if self._counts.get(name, 0) >= cap:
                holder = "this API key" if name.endswith(ALL_PEERS) else "this client"
                return ClientBusy(f"input: {holder} has {cap} pieces unfinished, the most it may have; retry when "
                                  "some have finished")
        return None

    def count(self, request_id: str, quotas: Quotas) -> None:
        names = tuple(name for name, _ in quotas)
        self._counts.update(names)
        self._held[request_id] = names

    def release(self, request_id: str) -> None:
        for name in self._held.pop(request_id, ()):
            self._counts[name] -= 1
            if self._counts[name] <= 0:
                del self._counts[name]

    def clear(self) -> None:
        self._counts.clear()
        self._held.clear()
