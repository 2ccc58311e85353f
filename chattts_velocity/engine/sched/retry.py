"""Engine stage: upstream's ensure_non_empty, bounded — an unseeded request whose first token is EOS runs again.

Upstream regenerates such a request forever; the engine queues it again at most MAX_REGENERATE times (a seeded
request would only repeat itself, so it is never retried).
"""
from __future__ import annotations

import logging

from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.schema import MAX_REGENERATE

logger = logging.getLogger("chattts_velocity")


class RetryOnEmpty:
    """Counts the retries of each request; `again` gives the fresh sequence to queue, or None."""

    def __init__(self, limit: int = MAX_REGENERATE) -> None:
        self.limit = limit
        self.tries: dict[str, int] = {}

    def again(self, seq: Sequence) -> Sequence | None:
        """A new sequence of the same request when `seq` finished empty at EOS and may retry; else None."""
        p = seq.params
        if seq.finish_reason != "eos" or seq.num_generated or p.seed is not None or not p.ensure_non_empty:
            return None
        tries = self.tries.get(seq.request_id, 0)
        if tries >= self.limit:
            self.tries.pop(seq.request_id, None)
            return None
        logger.warning("request %s ended at its first step; regenerating (%d/%d)", seq.request_id, tries + 1,
                       self.limit)
        self.tries[seq.request_id] = tries + 1
        return Sequence(seq.request_id, seq.prompt, p, arrival=seq.arrival)

    def forget(self, request_id: str) -> None:
        """The request is aborted: its count goes."""
        self.tries.pop(request_id, None)
