"""Serving stage: SSE events of a streamed response (the formats: audio/formats.py, their encoders: audio/encode.py)."""
from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Callable

from ..audio.captions import captions
from ..audio.timestamps import Timeline


def _event(payload: dict[str, object]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def sse_events(chunks: AsyncIterator[bytes], timeline: Timeline | None = None,
                     usage: Callable[[], dict[str, int]] | None = None,
                     done: Callable[[], dict[str, object]] | None = None) -> AsyncIterator[str]:
    """OpenAI's SSE variant: speech.audio.delta events (base64 audio), then speech.audio.done with `usage`
    ({"input_tokens", "output_tokens", "total_tokens"}, read when the audio has ended).

    With a timeline (the request asked for `timestamps`), a speech.audio.timestamp event {text, start, end} follows
    the delta that completes each sentence piece (all remaining ones before done). `done()` gives more fields of the
    done event, asked once the audio has ended (the whole caption file)."""
    sent = 0

    def stamps() -> list[str]:
        nonlocal sent
        new = [] if timeline is None else timeline.stamps[sent:]
        sent += len(new)
        return [_event({"type": "speech.audio.timestamp", **stamp.as_dict()}) for stamp in new]

    try:
        async for data in chunks:
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
            for event in stamps():
                yield event
    except Exception as exc:  # noqa: BLE001 -- the status line is already sent; report in band
        yield _event({"type": "speech.audio.error", "error": {"message": str(exc)}})
        return
    for event in stamps():
        yield event
    counts = usage() if usage is not None else {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    yield _event({"type": "speech.audio.done", "usage": counts, **(done() if done is not None else {})})


def caption_field(timeline: Timeline, fmt: str | None) -> Callable[[], dict[str, object]] | None:
    """The done event's {"captions": the whole SRT/VTT text}, read from the timeline when asked (None: no captions)."""
    if fmt is None:
        return None
    return lambda: {"captions": captions(timeline.stamps, fmt.lower(), timeline.sample_rate)}
