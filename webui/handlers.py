"""Web UI event handlers: widget values -> Chat calls -> (audio, refined text, stats) updates.

Only the public API is used (Chat, RefineTextParams, InferCodeParams, chattts_velocity.text speaker
helpers). Bad input surfaces as a gr.Warning toast plus an "error:" line in the stats box.
"""
from __future__ import annotations

import math
import queue
import random
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Iterator

import gradio as gr
import numpy as np

from chattts_velocity import Chat, InferCodeParams, RefineTextParams
from chattts_velocity.audio import SAMPLE_RATE, float_to_int16
from chattts_velocity.schema import check_sampling
from chattts_velocity.text import decode_prompt, decode_spk_emb, seed_context
from chattts_velocity.text.speaker import VOICE_SEED_MAX

from .clips import RunStats, read_clip

# name -> audio seed. The names carry no promise about the voice; they are bookmarks.
VOICE_PRESETS = {"Default": 2, "Timbre 1": 1111, "Timbre 2": 2222, "Timbre 3": 3333,
                 "Timbre 4": 4444, "Timbre 5": 5555}
Update = tuple  # (live chunk, full audio, spoken text, stats)


@dataclass(frozen=True)
class Request:
    """The Generate inputs, in the order the UI passes them."""

    text: str
    speaker: str
    clip_code: str
    transcript: str
    refine: bool
    text_seed: float
    audio_seed: float
    temperature: float
    top_p: float
    top_k: float


def ffmpeg_available() -> bool:
    """Gradio streams audio as AAC segments, which it encodes with ffmpeg."""
    return shutil.which("ffmpeg") is not None


def random_seed() -> int:
    return random.randint(1, VOICE_SEED_MAX)


def check_seed(value: float | None, field: str) -> int:
    """A seed box's value (gradio gives floats) as an int, under the library's one seed rule."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value == int(value)):
        raise ValueError(f"{field}: must be a whole number, got {value!r}")
    check_sampling({"seed": int(value)}, {"seed": field})
    return int(value)


class Handlers:
    """The callbacks of one UI; one Chat is shared by every browser session.

    Every Chat call except interrupt() holds `_lock`: an abandoned stream's engine thread must end
    before the next run starts, and speaker sampling swaps the global torch RNG.
    """

    def __init__(self, chat: Chat, use_vllm: bool = True, max_new_token: int = 2048) -> None:
        self.chat = chat
        self.use_vllm = use_vllm
        self.max_new_token = max_new_token
        self._lock = threading.Lock()
        self._interrupted = threading.Event()  # Chat.infer clears its own flag at every call
        with seed_context(0):
            self.speaker_dim = decode_spk_emb(chat.sample_random_speaker()).numel()

    # ---- small callbacks ------------------------------------------------------------------
    def speaker_for_seed(self, seed: float | None) -> str:
        """Seed -> speaker string: the same seed gives the same voice on every run."""
        try:
            seed = check_seed(seed, "audio seed")
            with self._lock, seed_context(seed):
                return self.chat.sample_random_speaker()
        except ValueError as exc:
            gr.Warning(str(exc))
            return gr.skip()

    def encode_clip(self, path: str | None) -> str:
        """Uploaded voice clip -> spk_smp string ("" when the clip is cleared)."""
        if not path:
            return ""
        try:
            clip = read_clip(path)
            with self._lock:
                return self.chat.sample_audio_speaker(clip, sample_rate=SAMPLE_RATE)
        except ValueError as exc:
            gr.Warning(str(exc))
            return ""

    def interrupt(self) -> None:
        self._interrupted.set()
        self.chat.interrupt()

    # ---- generate -------------------------------------------------------------------------
    def generate(self, text: str, speaker: str, clip_code: str, transcript: str, refine: bool,
                 text_seed: float, audio_seed: float, temperature: float, top_p: float, top_k: float,
                 progress: gr.Progress = gr.Progress(track_tqdm=True)) -> Iterator[tuple]:  # noqa: B008
        """Stream off: -> (full audio, spoken text, stats) updates.

        `progress` is never called: gradio sees the default and mirrors the engine's tqdm bars.
        """
        request = Request(text, speaker, clip_code, transcript, refine, text_seed, audio_seed,
                          temperature, top_p, top_k)
        for update in self._run(request, stream=False):
            yield update[1:]

    def generate_stream(self, *values) -> Iterator[Update]:
        """Stream on (same inputs as generate): -> (live chunk, full audio, spoken text, stats) updates."""
        yield from self._run(Request(*values), stream=True)

    def _run(self, r: Request, stream: bool) -> Iterator[Update]:
        stats, skip = RunStats(time.perf_counter()), gr.skip()
        # None (not skip) opens this run's live stream; gradio closes it when the generator stops.
        yield None, None, "", "running..."
        try:
            if not (r.text or "").strip():
                raise ValueError("text: the text box is empty; type something to say or pick an example")
            params = self._code_params(r)
            self._interrupted.clear()
            spoken = self._refine(r) if r.refine else r.text
            yield skip, skip, spoken, skip
            if self._interrupted.is_set():  # pressed during the refine pass
                yield skip, skip, skip, "interrupted before audio"
                return
            if stream:
                yield from self._stream(spoken, params, stats)
                return
            with self._lock:
                wav = self.chat.infer(spoken, skip_refine_text=True, params_infer_code=params,
                                      use_vllm=self.use_vllm)[0]
            stats.add(len(wav), time.perf_counter())
            stats.end = time.perf_counter()
            yield skip, (SAMPLE_RATE, float_to_int16(wav)), skip, stats.summary()
        except ValueError as exc:
            gr.Warning(str(exc))
            yield skip, skip, skip, f"error: {exc}"

    def _stream(self, spoken: str, params: InferCodeParams, stats: RunStats) -> Iterator[Update]:
        # Gradio encodes every yielded chunk with ffmpeg before it resumes the generator, so the
        # engine runs in its own thread and each yield sends whatever audio is ready by then.
        ready: queue.Queue = queue.Queue()
        producer = threading.Thread(target=self._produce, args=(spoken, params, stats, ready), daemon=True)
        producer.start()
        pieces: list[np.ndarray] = []
        try:
            for batch in _batches(ready):
                pieces += batch
                live = (SAMPLE_RATE, float_to_int16(np.concatenate(batch)))
                yield live, gr.skip(), gr.skip(), stats.summary(live=True)
        finally:
            producer.join(timeout=0.5)
            if producer.is_alive():  # the browser went away: stop the engine (one TTS run at a time)
                self.chat.interrupt()
        full = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        yield gr.skip(), (SAMPLE_RATE, float_to_int16(full)), gr.skip(), stats.summary()

    def _produce(self, spoken: str, params: InferCodeParams, stats: RunStats, ready: queue.Queue) -> None:
        """Engine thread: puts float32 chunks, then None (done) or the exception that stopped it."""
        try:
            with self._lock:
                for chunks in self.chat.infer(spoken, stream=True, skip_refine_text=True,
                                              params_infer_code=params, use_vllm=self.use_vllm):
                    chunk = np.asarray(chunks[0], dtype=np.float32)  # [n] new samples of text 0
                    if chunk.size:
                        stats.add(chunk.size, time.perf_counter())
                        ready.put(chunk)
            stats.end = time.perf_counter()
            ready.put(None)
        except Exception as exc:  # handed to the UI thread, which re-raises it
            ready.put(exc)

    def _refine(self, r: Request) -> str:
        # Same sliders for both passes, as in the upstream web UI (users compare the two).
        params = RefineTextParams(temperature=float(r.temperature), top_P=float(r.top_p), top_K=int(r.top_k),
                                  manual_seed=check_seed(r.text_seed, "text seed"), show_tqdm=True)
        with self._lock:
            return self.chat.infer(r.text, refine_text_only=True, params_refine_text=params,
                                   use_vllm=self.use_vllm)

    def _code_params(self, r: Request) -> InferCodeParams:
        spk_emb, spk_smp, txt_smp = self._check_voice(r.speaker, r.clip_code, r.transcript)
        return InferCodeParams(spk_emb=spk_emb, spk_smp=spk_smp, txt_smp=txt_smp,
                               temperature=float(r.temperature), top_P=float(r.top_p), top_K=int(r.top_k),
                               manual_seed=check_seed(r.audio_seed, "audio seed"),
                               max_new_token=self.max_new_token, show_tqdm=True)

    def _check_voice(self, speaker: str, clip_code: str, transcript: str) -> tuple[str | None, ...]:
        """-> (spk_emb, spk_smp, txt_smp). A cloned clip wins over the speaker string."""
        speaker, clip_code, transcript = (s.strip() for s in (speaker or "", clip_code or "", transcript or ""))
        if clip_code:
            decode_prompt(clip_code)  # raises ValueError naming spk_smp when malformed
            if not transcript:
                raise ValueError("clip transcript: type the words spoken in the voice clip "
                                 "(or clear the clip to use the speaker string)")
            return None, clip_code, transcript
        if not speaker:
            return None, None, None
        dim = decode_spk_emb(speaker).numel()
        if dim != self.speaker_dim:
            raise ValueError(f"speaker: this string holds a {dim}-wide voice but the loaded model needs "
                             f"{self.speaker_dim}; press 🎲 for a new one or paste one made for this model")
        return speaker, None, None


def _batches(ready: queue.Queue) -> Iterator[list[np.ndarray]]:
    """Block for the next chunk, then take every chunk already waiting; re-raise a producer error."""
    while True:
        batch = [ready.get()]
        while not ready.empty():
            batch.append(ready.get())
        done = batch[-1] is None or isinstance(batch[-1], Exception)
        chunks = [c for c in batch if isinstance(c, np.ndarray)]
        if chunks:
            yield chunks
        if isinstance(batch[-1], Exception):
            raise batch[-1]
        if done:
            return
