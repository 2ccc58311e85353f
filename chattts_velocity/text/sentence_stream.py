"""Text stage: sentences out of a text that arrives in pieces (an LLM's tokens over the speech WebSocket).

A sentence ends where the normaliser's splitter ends one (text.normalizer.split_text): after "。", after "." followed
by one whitespace character (which stays with the sentence), and at a newline. Text after the last end waits for
more; `flush()` hands it over as the last sentence. A word or a sentence end split across deltas ("Hel" + "lo." +
" Next") completes when its end arrives, never earlier. Whitespace-only sentences are dropped.
"""
from __future__ import annotations

import re

_END = re.compile(r"。|\.\s|\n")


class SentenceStream:
    """Feed text deltas, get complete sentences, in order; at most `max_sentence_chars` may wait for an end."""

    def __init__(self, max_sentence_chars: int) -> None:
        self.max_sentence_chars = max_sentence_chars
        self.pending = ""

    def feed(self, delta: str) -> list[str]:
        """The sentences `delta` completes; a ValueError naming `text` when the text waiting for an end grows past
        max_sentence_chars."""
        self.pending += delta
        ends = [m.end() for m in _END.finditer(self.pending)]
        sentences = []
        start = 0
        for end in ends:
            sentences.append(self.pending[start:end])
            start = end
        self.pending = self.pending[start:]
        if len(self.pending) > self.max_sentence_chars:
            raise ValueError(f"text: {len(self.pending)} characters without a sentence end ('. ', '。' or a newline), "
                             f"over the limit of {self.max_sentence_chars}; end sentences as they come")
        return [s for s in sentences if s.strip()]

    def flush(self) -> list[str]:
        """The text still waiting, as the last sentence (none when it is only whitespace)."""
        rest, self.pending = self.pending, ""
        return [rest] if rest.strip() else []
