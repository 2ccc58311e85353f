"""Sentences out of text deltas: the normaliser's ends, words and ends split across deltas, the waiting limit."""
from __future__ import annotations

import pytest

from chattts_velocity.text.normalizer import split_text
from chattts_velocity.text.sentence_stream import SentenceStream

TEXT = "Hello there. This is 3.14 long. 你好。再见。And the last one"


def test_any_cut_of_a_text_gives_the_splitters_sentences() -> None:
    for size in (1, 2, 3, 7, len(TEXT)):
        stream, out = SentenceStream(100), []
        for at in range(0, len(TEXT), size):
            out += stream.feed(TEXT[at : at + size])
        assert out + stream.flush() == split_text(TEXT)


def test_a_sentence_completes_only_when_its_end_arrives() -> None:
    stream = SentenceStream(100)
    assert stream.feed("Hel") == [] and stream.feed("lo wor") == [] and stream.feed("ld.") == []  # "3.14"-safe
    assert stream.feed(" How") == ["Hello world. "] and stream.feed(" are you\nFine") == ["How are you\n"]
    assert stream.flush() == ["Fine"] and stream.flush() == [] and stream.feed("  \n") == []


def test_text_waiting_too_long_for_an_end_is_an_error_naming_text() -> None:
    stream = SentenceStream(10)
    assert stream.feed("Short. ") == ["Short. "]
    with pytest.raises(ValueError, match="^text: 11 characters without a sentence end"):
        stream.feed("x" * 11)
