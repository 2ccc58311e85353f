"""Web UI event handlers: widget values -> speech pipeline calls -> (audio, download, refined text, stats) updates.

The page runs on a SpeechPipeline (Chat.pipeline): each run is one job (`pipeline.synthesis(job)`: its refine pass,
then its audio, whole or streamed; the refined text is shown once the pass ends) and voices come from its
`speakers` (draws, clip codes, the width check). Bad input surfaces as a gr.Warning toast plus an "error:" line in
the stats box. Every run belongs to the browser session that started it (gradio's session hash, `session`):
Interrupt stops only that session's run, and its downloads live in that session's folder, removed when the session
ends (`forget`) or when older than `files_ttl_s`.
"""
from __future__ import annotations

import queue
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar, cast

import gradio as gr
import numpy as np

from chattts_velocity import InferCodeParams
from chattts_velocity.audio import SAMPLE_RATE, float_to_int16
from chattts_velocity.audio.formats import available_formats
from chattts_velocity.schema import MAX_NEW_TOKEN
from chattts_velocity.speech import SpeechPipeline, Synthesis, SynthesisJob, TextOptions
from chattts_velocity.text.speaker import VOICE_SEED_MAX
from chattts_velocity.text.voices import PRESET_SEEDS, VoiceLibrary

from .clips import RunStats, read_clip
from .controls import (
    Request,
    batch_size,
    check_seed,
    preset_for_seed,
    speed_prompt,
    write_download,
)
from .scripts import ScriptRuns, page_script, refine_params
from .sessions import Run, SessionRuns
from .voice_check import VoiceCheck
from .worker import Chunk, RunOptions, ShownText, Update, batches, outcome

T = TypeVar("T")
PROGRESS_EVERY_S = 0.5  # how often a run's progress line in the stats box is refreshed
MAX_RUN_CHARS = 5000  # characters of text one run may hold: a run holds the page's one engine slot while it works
FILES_TTL_S = 3600  # a download older than this is removed (also when its session ends)
# The live player's first chunk: gradio's AAC encoder emits no frame for the 0.1 s first chunk of an engine
# stream, and a player opened on a playlist without segments logs HLS "No Segments" errors until one comes.
FIRST_LIVE_SAMPLES = SAMPLE_RATE // 2


def ffmpeg_available() -> bool:
    """Gradio streams audio as AAC segments, which it encodes with ffmpeg."""
    return shutil.which("ffmpeg") is not None


def warn(exc: Exception) -> None:
    """A short toast (the stats box keeps the message): long ones pile up over the controls."""
    gr.Warning(str(exc), duration=6)


def random_seed() -> int:
    return random.randint(1, VOICE_SEED_MAX)


class Handlers(ScriptRuns):
    """The callbacks of one UI; one SpeechPipeline is shared by every browser session.

    Every model call goes through the pipeline's call gate (an abandoned stream's engine thread must end before the
    next run starts) and stops at the next step once its run's own stop flag is set (its session's Interrupt, or
    the browser gone): a new run's flag is new, so starting it never revives an abandoned one.
    """

    def __init__(self, pipeline: SpeechPipeline, gpt: str = "velocity", max_new_token: int = MAX_NEW_TOKEN,
                 voices: VoiceLibrary | None = None, max_chars: int = MAX_RUN_CHARS,
                 files_ttl_s: float = FILES_TTL_S) -> None:
        self.pipeline, self.voice_check = pipeline, VoiceCheck(pipeline, voices)
        self.gpt = gpt  # the GPT path every run of the page takes ("velocity" or "plain")
        self.max_new_token = max_new_token
        self.max_chars = max_chars
        self.sessions = SessionRuns(tempfile.mkdtemp(prefix="chattts-velocity-webui-"), files_ttl_s)

    # ---- small callbacks ------------------------------------------------------------------
    def speaker_for_seed(self, seed: float | None) -> tuple[object, object, object]:
        """Seed -> (speaker string, preset name, stats line): the same seed gives the same voice on every run,
        and the preset box follows the seed (a dice roll or a typed seed shows Custom). A bad seed answers in
        the stats box and a toast."""
        if seed is None:  # cleared (a saved voice was picked): the speaker string stands on its own
            return gr.skip(), gr.skip(), gr.skip()
        try:
            seed = check_seed(seed, "audio seed")  # the seed's own generator: no lock, no global RNG
            return self.pipeline.speakers.random(seed=seed), preset_for_seed(seed), gr.skip()
        except ValueError as exc:
            warn(exc)
            return gr.skip(), gr.skip(), f"error: {exc}"

    def voice_for_preset(self, name: str) -> tuple[object, object]:
        """Preset -> (audio seed, speaker string); Custom keeps both (it only names a seed no preset has)."""
        if name not in PRESET_SEEDS:
            return gr.skip(), gr.skip()
        return PRESET_SEEDS[name], self.speaker_for_seed(PRESET_SEEDS[name])[0]

    def encode_clip(self, path: str | None) -> tuple[object, object, object]:
        """Uploaded or recorded voice clip -> (spk_smp string, stats line, clip player); a file that is not audio
        is named in the stats and removed from the player."""
        if not path:
            return "", gr.skip(), gr.skip()
        try:
            clip = read_clip(path)
            code = self.pipeline.speakers.from_audio(clip, sample_rate=SAMPLE_RATE)  # in its turn at the model
        except ValueError as exc:
            warn(exc)
            return "", f"error: {exc}", None
        done = f"clip encoded: {len(clip) / SAMPLE_RATE:.1f} s; type its transcript, then Generate"
        gr.Info(done, duration=3)
        return code, done, gr.skip()

    def interrupt(self, session: str = "") -> None:
        """Interrupt pressed: stop this session's run (no other session's)."""
        self.sessions.interrupt(session)

    def forget(self, session: str = "") -> None:
        """The session ended (its tab closed): stop its run and remove its downloads."""
        self.sessions.forget(session)

    # ---- generate -------------------------------------------------------------------------
    def generate(self, *values: Any, session: str = "") -> Iterator[tuple[object, ...]]:
        """Stream off: Request values -> (full audio, download, spoken text, stats) updates. The stats box is
        the run's one progress display (elapsed time, audio made), refreshed every PROGRESS_EVERY_S."""
        for update in self._run(Request(*values), stream=False, session=session):
            yield update[1:]

    def generate_stream(self, *values: Any, session: str = "") -> Iterator[Update]:
        """Stream on (same inputs as generate): -> (live chunk, full audio, download, spoken text, stats)."""
        yield from self._run(Request(*values), stream=True, session=session)

    def _run(self, r: Request, stream: bool, session: str) -> Iterator[Update]:
        skip = gr.skip()
        # The live player is left alone until the first chunk: a stream opened empty has the browser poll a
        # playlist without segments (HLS "No Segments" errors) through the refine pass and the first chunk.
        yield skip, None, None, "", "running..."
        self.sessions.sweep()  # downloads past their time, whoever made them
        with self.sessions.run(session) as run:
            yield from self._run_checked(r, stream, run)

    def _run_checked(self, r: Request, stream: bool, run: Run) -> Iterator[Update]:
        stats, skip = RunStats(time.perf_counter()), gr.skip()
        try:
            self._check_text(r.text)
            params, options = self._code_params(r), self._split_options(r, run.stop)
            refine = refine_params(r) if r.refine else None
            if (script := page_script(r)) is not None:  # [voice]/[pause] tags or captions: webui/scripts.py
                yield from self._script_run(r, script, params, options, stats, run)
                return
            # One job: the refine pass (if any), then the audio of the refined text; the page shows the refined
            # text once the pass ends.
            shape = "chunks" if stream else "whole"
            synthesis = self.pipeline.synthesis(self._job(r.text, params, options, refine=refine, shape=shape))
            spoken = ShownText(synthesis, r.text)
            yield skip, skip, skip, spoken.text() if refine is None else skip, skip
            if stream:
                yield from self._stream(synthesis, spoken, stats, r.fmt, run)
                return
            waves = yield from self._wait(synthesis.run, stats, spoken.doing, options["stop"], spoken.update)
            wav = cast(list[np.ndarray], waves)[0]  # run() gives waveforms without refine_only
            if run.interrupted.is_set() and not len(wav):  # pressed during the refine pass
                yield skip, skip, skip, spoken.text(), "interrupted before audio"
                return
            stats.add(len(wav), time.perf_counter())
            stats.end = time.perf_counter()
            yield skip, *self._results(wav, r.fmt, run), spoken.text(), self._final(stats, run)
        except ValueError as exc:
            warn(exc)
            yield skip, skip, skip, skip, f"error: {exc}"

    def _wait(self, work: Callable[[], T], stats: RunStats, doing: str | Callable[[], str],
              stop: threading.Event, note: Callable[[], object] = gr.skip) -> Generator[Update, None, T]:
        """Run work() in a thread; meanwhile show the progress line (`doing`, and `note()` in the spoken-text box)
        every PROGRESS_EVERY_S. Returns its result."""
        done: queue.Queue[T | Exception] = queue.Queue()
        worker = threading.Thread(target=lambda: done.put(outcome(work)), daemon=True)
        worker.start()
        try:
            while True:
                try:
                    result = done.get(timeout=PROGRESS_EVERY_S)
                    break
                except queue.Empty:
                    label = doing if isinstance(doing, str) else doing()
                    yield gr.skip(), gr.skip(), gr.skip(), note(), stats.progress(label)
        finally:
            if worker.is_alive():  # the browser went away: stop the engine (one TTS run at a time)
                stop.set()
        if isinstance(result, Exception):
            raise result
        return result

    def _job(self, text: str, params: InferCodeParams, options: RunOptions, **extra: Any) -> SynthesisJob:
        """One run of the page: its text, its own stop flag, the page's engine and batch size (extra: its refine
        settings, its shape)."""
        return SynthesisJob([text], params, text=TextOptions(split=options["split"]), gpt=self.gpt,
                            max_batch=options["max_batch"], progress=False, stop=options["stop"].is_set, **extra)

    def _check_text(self, text: str | None) -> None:
        if not (text or "").strip():
            raise ValueError("text: the text box is empty; type something to say or pick an example")
        if len(text or "") > self.max_chars:
            raise ValueError(f"text: {len(text or '')} characters is over this page's limit of {self.max_chars} a "
                             "run; split it, or use `chattts-velocity export` or the server for long texts")

    @staticmethod
    def _final(stats: RunStats, run: Run) -> str:
        """The stats box after a run: an interrupted run says so in its first line."""
        head = "interrupted: the audio made before Interrupt is kept" if run.interrupted.is_set() else None
        return stats.summary(head=head)

    @staticmethod
    def _results(wav: np.ndarray, fmt: str, run: Run) -> tuple[tuple[int, np.ndarray], str]:
        """-> (player audio, download file): the player always gets WAV, the download the chosen format, written
        in the run's session folder."""
        return (SAMPLE_RATE, float_to_int16(wav)), str(write_download(wav, fmt, run.folder))

    def _stream(self, synthesis: Synthesis, spoken: ShownText, stats: RunStats, fmt: str, run: Run) -> Iterator[Update]:
        # Gradio encodes every yielded chunk with ffmpeg before it resumes the generator, so the
        # engine runs in its own thread and each yield sends whatever audio is ready by then.
        ready: queue.Queue[Chunk] = queue.Queue()
        producer = threading.Thread(target=self._produce, args=(synthesis, stats, ready), daemon=True)
        producer.start()
        pieces: list[np.ndarray] = []
        pending: list[np.ndarray] = []  # not yet sent to the live player
        try:
            for batch in batches(ready, PROGRESS_EVERY_S):
                pieces += batch
                pending += batch
                live: object = gr.skip()
                player_open = len(pieces) > len(pending)  # an earlier chunk went out: send each one as it comes
                if pending and (player_open or sum(map(len, pending)) >= FIRST_LIVE_SAMPLES):
                    live, pending = _live(pending), []
                yield live, gr.skip(), gr.skip(), spoken.update(), stats.progress(spoken.doing("streaming"))
        finally:
            producer.join(timeout=0.5)
            if producer.is_alive():  # the browser went away: stop the engine (one TTS run at a time)
                run.stop.set()
        if pending:  # a run shorter than FIRST_LIVE_SAMPLES
            yield _live(pending), gr.skip(), gr.skip(), gr.skip(), stats.progress("streaming")
        full = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        yield gr.skip(), *self._results(full, fmt, run), spoken.text(), self._final(stats, run)

    @staticmethod
    def _produce(synthesis: Synthesis, stats: RunStats, ready: queue.Queue[Chunk]) -> None:
        """Engine thread: puts float32 chunks, then None (done) or the exception that stopped it."""
        try:
            for chunks in synthesis.stream():
                chunk = np.asarray(chunks[0], dtype=np.float32)  # [n] new samples of text 0
                if chunk.size:
                    stats.add(chunk.size, time.perf_counter())
                    ready.put(chunk)
            stats.end = time.perf_counter()
            ready.put(None)
        except Exception as exc:  # handed to the UI thread, which re-raises it
            ready.put(exc)

    def _code_params(self, r: Request) -> InferCodeParams:
        spk_emb, spk_smp, txt_smp = self.voice_check.voice(r.speaker, r.clip_code, r.transcript)
        return InferCodeParams(prompt=speed_prompt(r.speed), spk_emb=spk_emb, spk_smp=spk_smp, txt_smp=txt_smp,
                               temperature=float(r.temperature), top_P=float(r.top_p), top_K=int(r.top_k),
                               manual_seed=None if r.audio_seed is None else check_seed(r.audio_seed, "audio seed"),
                               max_new_token=self.max_new_token, show_tqdm=False)

    @staticmethod
    def _split_options(r: Request, stop: threading.Event) -> RunOptions:
        """How long text runs (split into pieces, pieces per batch), stopped by `stop`; also checks the download
        format first."""
        if r.fmt not in available_formats():
            raise ValueError(f"format: choose one of {list(available_formats())}, got {r.fmt!r}")
        return {"split": bool(r.split_text), "max_batch": batch_size(r.batch_size), "stop": stop}


def _live(chunks: list[np.ndarray]) -> tuple[int, np.ndarray]:
    return SAMPLE_RATE, float_to_int16(np.concatenate(chunks))

