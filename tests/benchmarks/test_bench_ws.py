"""bench_ws's simulated LLM: its tokens are the text, and the first sentence's end mark arrives with its space."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bench_ws  # noqa: E402 (after the path above)
from chattts_velocity.text.sentence_stream import SentenceStream  # noqa: E402 (after the path above)


def test_the_last_token_of_the_first_sentence_completes_it() -> None:
    tokens = bench_ws._tokens(bench_ws.FIRST)
    assert "".join(tokens) == bench_ws.FIRST and len(tokens) > 5
    stream = SentenceStream(1000)
    assert [stream.feed(t) for t in tokens[:-1]] == [[]] * (len(tokens) - 1)
    assert stream.feed(tokens[-1]) == [bench_ws.FIRST]
    assert "".join(bench_ws._tokens(bench_ws.REST)) == bench_ws.REST
