"""bench_ws's simulated LLM: its tokens are the text, and the first sentence's end mark arrives with its space."""
from __future__ import annotations

from benchmarks import bench_ws
from chattts_velocity.text.sentence_stream import SentenceStream


def test_the_last_token_of_the_first_sentence_completes_it() -> None:
    tokens = bench_ws._tokens(bench_ws.FIRST)
    assert "".join(tokens) == bench_ws.FIRST and len(tokens) > 5
    stream = SentenceStream(1000)
    assert [stream.feed(t) for t in tokens[:-1]] == [[]] * (len(tokens) - 1)
    assert stream.feed(tokens[-1]) == [bench_ws.FIRST]
    assert "".join(bench_ws._tokens(bench_ws.REST)) == bench_ws.REST
