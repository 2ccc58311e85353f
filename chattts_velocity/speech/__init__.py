"""Streaming speech: engine deltas -> StreamDecoders -> float32 24 kHz chunks, in order per text.

streams.py holds the shared pieces (StreamOptions, StreamSet) and the synchronous `Chat.infer(stream=True)` loop;
service.py the server's SpeechService (an AsyncLLMEngine plus one decode thread batching every live stream).
"""
from chattts_velocity.speech.streams import EMPTY, StreamOptions, StreamSet, delta_rows, stream_texts

__all__ = ["EMPTY", "StreamOptions", "StreamSet", "delta_rows", "stream_texts"]
