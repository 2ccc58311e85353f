"""Web UI handlers without a browser: control values -> the prompts, params and files the speech pipeline
receives."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("gradio")

from chattts_velocity.audio.formats import available_formats  # noqa: E402 (after the importorskip above)
from chattts_velocity.params import SHARED_MAX_BEAMS  # noqa: E402 (after the importorskip above)
from chattts_velocity.schema import TextPieces  # noqa: E402 (after the importorskip above)
from chattts_velocity.speech import SynthesisJob, TextFrontEnd  # noqa: E402 (after the importorskip above)
from chattts_velocity.speech.calls import CallGate  # noqa: E402 (after the importorskip above)
from chattts_velocity.text import encode_spk_emb, sample_random_speaker, seed_context  # noqa: E402 (after the importorskip above)
from webui.controls import (  # noqa: E402 (after the importorskip above)
    CUSTOM,
    preset_for_seed,
    refine_prompt,
    speed_prompt,
    write_download,
)
from webui.handlers import Handlers, Request  # noqa: E402 (after the importorskip above)

HIDDEN = 64
MAGIC = {"wav": b"RIFF", "flac": b"fLaC", "opus": b"OggS", "ogg": b"OggS"}


class RecordingFrontEnd(TextFrontEnd):
    """The real front end's speaker check for a HIDDEN-wide model; a text is one piece, and knows its split flag."""

    def __init__(self) -> None:
        super().__init__(None, HIDDEN, audio_eos_id=625, normalizer=object())

    def pieces(self, texts: str, *, split: bool = True, **options) -> TextPieces:
        pieces = TextPieces([texts], [0], 1)
        pieces.split = split
        return pieces


class RecordingSynthesis:
    """A job's verbs as SpeechPipeline.synthesis gives them: run() (the refine pass, its texts in `refined`, then
    the code pass on them), stream(), cancel()."""

    def __init__(self, pipeline: RecordingPipeline, job: SynthesisJob) -> None:
        self.pipeline, self.job, self.refined = pipeline, job, None

    def run(self) -> list:
        return self.pipeline.run(self)

    def stream(self):
        return self.pipeline.stream(self.job)

    def cancel(self) -> None:
        pass


class RecordingSpeakers:
    """SpeechPipeline.speakers for a HIDDEN-wide model (the check is the real front end's)."""

    def __init__(self, frontend: TextFrontEnd) -> None:
        self.frontend = frontend

    def random(self, seed: int | None = None) -> str:
        return sample_random_speaker(HIDDEN, seed=seed)

    def check(self, speaker: str, field: str = "speaker") -> None:
        self.frontend.speaker(speaker, field)


class RecordingPipeline:
    """SpeechPipeline's surface as the handlers use it (synthesis(job): one job, its refine pass then its audio;
    speakers); every pass is recorded ({"pass": "refine" or "code", "text", "params", "split", "max_batch"}). The
    waveform's length follows the speed prompt, so a test can see the prompt reached the code pass."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.jobs: list[SynthesisJob] = []
        self.frontend = RecordingFrontEnd()
        self.speakers = RecordingSpeakers(self.frontend)
        self.gate = CallGate()

    def run(self, synthesis: RecordingSynthesis) -> list:
        job = synthesis.job
        pieces = self.frontend.pieces(job.texts[0], split=job.text.split)
        with self.gate.call(job.stop) as stop:
            if job.refine is not None:
                pieces = self.refine(pieces, job.refine, max_batch=job.max_batch, stop=stop)
                synthesis.refined = list(pieces.texts)
            return self.generate(SimpleNamespace(pieces=pieces, params=job.params), max_batch=job.max_batch,
                                 stop=stop)

    def synthesis(self, job: SynthesisJob) -> RecordingSynthesis:
        self.jobs.append(job)
        return RecordingSynthesis(self, job)

    def record(self, kind: str, pieces: TextPieces, params, max_batch: int | None) -> None:
        self.calls.append({"pass": kind, "text": pieces.texts[0], "params": params, "split": pieces.split,
                           "max_batch": max_batch})

    def refine(self, pieces: TextPieces, params, *, max_batch: int | None = None, **options) -> TextPieces:
        self.record("refine", pieces, params, max_batch)
        refined = pieces.replace([f"{pieces.texts[0]} {params.prompt}"])
        refined.split = pieces.split  # the code pass reads the refined pieces themselves
        return refined

    def generate(self, requests: SimpleNamespace, *, max_batch: int | None = None, **options) -> list[np.ndarray]:
        self.record("code", requests.pieces, requests.params, max_batch)
        speed = int(requests.params.prompt[len("[speed_"):-1])
        return [np.full(2400 * (speed + 1), 0.25, dtype=np.float32)]


def _request(**changes) -> list:
    values = dict(text="Hello there.", speaker="", clip_code="", transcript="", refine=True, oral=2, laugh=0,
                  pause=6, refine_beams=1, text_seed=42, audio_seed=2, speed=5, temperature=0.3, top_p=0.7, top_k=20,
                  split_text=True, batch_size=4, fmt="wav")
    values.update(changes)
    return list(Request(**values).__dict__.values())


def _final(handlers: Handlers, **changes) -> list:
    """Each output's last value, as the page shows it after the run: [audio, download, spoken, stats]."""
    shown: list = [None] * 4
    for update in handlers.generate(*_request(**changes)):
        shown = [old if isinstance(new, dict) and new.get("__type__") == "update" else new
                 for old, new in zip(shown, update, strict=True)]
    return shown


def test_prompts_follow_the_levels_and_name_a_bad_field() -> None:
    assert speed_prompt(2.0) == "[speed_2]"
    assert refine_prompt(0, 2, 7) == "[oral_0][laugh_2][break_7]"
    for call, field in ((lambda: speed_prompt(10), "speed"), (lambda: refine_prompt(1, 3, 0), "laugh"),
                        (lambda: refine_prompt(1.5, 0, 0), "oral"), (lambda: refine_prompt(0, 0, -1), "break")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            call()


def test_preset_follows_the_seed() -> None:
    assert preset_for_seed(1111) == "alloy"
    assert preset_for_seed(1112) == CUSTOM


@pytest.mark.parametrize("fmt", available_formats())
def test_download_is_encoded_in_the_chosen_format(fmt: str, tmp_path: Path) -> None:
    wav = np.sin(np.linspace(0, 200, 4800)).astype(np.float32) * 0.3
    path = write_download(wav, fmt, tmp_path)
    data = path.read_bytes()
    assert path.name == f"speech.{fmt}" and path.parent.parent == tmp_path
    if fmt == "pcm":
        assert len(data) == 2 * wav.size
    elif fmt == "mp3":
        assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
    elif fmt == "aac":  # ADTS: 12-bit sync word, layer 0
        assert data[0] == 0xFF and data[1] & 0xF6 == 0xF0
    else:
        assert data[:4] == MAGIC[fmt]
    assert write_download(wav, fmt, tmp_path) != path  # a second run never overwrites the first


def test_generate_passes_every_control_to_the_pipeline() -> None:
    pipeline = RecordingPipeline()
    audio, download, spoken, stats = _final(Handlers(pipeline), speed=8, oral=4, laugh=1, pause=3, refine_beams=3,
                                            split_text=False, batch_size=7, fmt="flac")
    refine, code = pipeline.calls
    assert (refine["pass"], code["pass"]) == ("refine", "code")
    (job,) = pipeline.jobs  # one job: its refine pass, then the audio of the refined text
    assert job.refine is not None and not job.refine_only
    assert refine["params"].prompt == "[oral_4][laugh_1][break_3]" and refine["params"].beam_width == 3
    assert code["params"].prompt == "[speed_8]"
    assert spoken == "Hello there. [oral_4][laugh_1][break_3]" == code["text"]
    for call in pipeline.calls:
        assert (call["split"], call["max_batch"]) == (False, 7)
    assert audio[1].size == 2400 * 9 and stats.startswith("audio: 0.90 s")
    assert Path(download).suffix == ".flac" and Path(download).read_bytes()[:4] == b"fLaC"


def test_the_pages_default_step_cap_is_the_librarys_own() -> None:
    """One default per cap: the page keeps no copy of its own (a copy would be another int object)."""
    import inspect

    from chattts_velocity.schema import MAX_NEW_TOKEN
    from webui.app import build_ui

    for page_part in (Handlers, build_ui):
        assert inspect.signature(page_part).parameters["max_new_token"].default is MAX_NEW_TOKEN
    assert Handlers(RecordingPipeline()).max_new_token is MAX_NEW_TOKEN


def test_refine_beams_out_of_range_are_a_toast_naming_them() -> None:
    pipeline = RecordingPipeline()
    for beams in (0, SHARED_MAX_BEAMS + 1, 1.5):
        *_, stats = _final(Handlers(pipeline), refine_beams=beams)
        assert stats.startswith("error: refine beams:"), stats
    assert pipeline.calls == []


def test_speed_changes_the_audio_and_refine_off_skips_the_pass() -> None:
    pipeline = RecordingPipeline()
    handlers = Handlers(pipeline)
    slow, fast = (_final(handlers, speed=s, refine=False)[0][1] for s in (2, 8))
    assert slow.size != fast.size
    assert all(c["pass"] == "code" for c in pipeline.calls)


@pytest.mark.parametrize(("changes", "field"), [({"batch_size": 0}, "batch size"), ({"fmt": "aiff"}, "format"),
                                                ({"speed": 11}, "speed"), ({"laugh": 5}, "laugh")])
def test_bad_control_values_end_in_an_error_line(changes: dict, field: str) -> None:
    pipeline = RecordingPipeline()
    with pytest.warns(UserWarning, match=f"^{field}:"):  # the toast (outside a page gradio warns instead)
        *_, stats = _final(Handlers(pipeline), **changes)
    assert stats.startswith(f"error: {field}:")
    assert pipeline.calls == []  # nothing was generated


def test_seed_gives_the_speaker_and_the_preset_name() -> None:
    handlers = Handlers(RecordingPipeline())
    with seed_context(1111):
        want = sample_random_speaker(HIDDEN)
    speaker, preset, stats = handlers.speaker_for_seed(1111)
    assert (speaker, preset) == (want, "alloy") and stats.get("__type__") == "update"  # the stats box is kept
    assert handlers.speaker_for_seed(77)[1] == CUSTOM
    with pytest.warns(UserWarning, match="^audio seed:"):
        *kept, stats = handlers.speaker_for_seed(1.5)
    assert all(v.get("__type__") == "update" for v in kept) and stats.startswith("error: audio seed:")


class InterruptedPipeline(RecordingPipeline):
    """A person presses Interrupt while the code pass runs; the pass sees its stop flag and returns the audio made
    so far."""

    handlers: Handlers

    def generate(self, requests: SimpleNamespace, *, stop, **options) -> list[np.ndarray]:
        self.handlers.interrupt()
        assert stop()
        return super().generate(requests, **options)


def test_an_interrupted_run_says_so_in_the_stats() -> None:
    pipeline = InterruptedPipeline()
    handlers = pipeline.handlers = Handlers(pipeline)
    *_, stats = _final(handlers, refine=False)
    assert stats.startswith("interrupted:") and "audio: " in stats
    *_, stats = _final(Handlers(RecordingPipeline()), refine=False)
    assert stats.startswith("audio: ")  # a normal finish does not


class GatedPipeline(RecordingPipeline):
    """The refine pass waits until the test has seen the page's progress line."""

    def __init__(self) -> None:
        super().__init__()
        self.shown = threading.Event()

    def refine(self, pieces: TextPieces, params, **options) -> TextPieces:
        assert self.shown.wait(120), "no progress line was shown while the model worked"  # a hang deadline only
        return super().refine(pieces, params, **options)


def test_a_run_shows_one_progress_line_while_it_works(monkeypatch) -> None:
    from webui import handlers as module

    monkeypatch.setattr(module, "PROGRESS_EVERY_S", 0.01)
    pipeline = GatedPipeline()
    shown = []
    for update in Handlers(pipeline).generate(*_request(refine=True)):
        if isinstance(update[3], str):
            shown.append(update[3])
            if shown[-1].startswith(("refining the text...", "generating...")):
                pipeline.shown.set()
    progress = [s for s in shown if "..." in s.splitlines()[0]]
    assert any(s.startswith("refining the text... ") for s in progress)
    assert all(len(s.splitlines()) == 1 and "step" not in s for s in progress)  # no "47/2.0k step" bounds
    assert shown[-1].startswith("audio: ")


def test_an_empty_audio_seed_keeps_the_speaker_and_samples_freely() -> None:
    pipeline = RecordingPipeline()
    handlers = Handlers(pipeline)
    assert all(isinstance(v, dict) and v.get("__type__") == "update" for v in handlers.speaker_for_seed(None))
    speaker = sample_random_speaker(HIDDEN)
    *_, stats = _final(handlers, audio_seed=None, speaker=speaker, refine=False)
    assert stats.startswith("audio: ")
    params = pipeline.calls[-1]["params"]
    assert params.manual_seed is None and params.spk_emb == speaker


def test_a_clip_upload_answers_in_the_stats(tmp_path: Path) -> None:
    import wave

    pipeline = RecordingPipeline()
    pipeline.speakers.from_audio = lambda clip, sample_rate: f"codes of {len(clip)}"
    handlers = Handlers(pipeline)
    notes = tmp_path / "notes.wav"
    notes.write_text("not audio\n" * 20)
    with pytest.warns(UserWarning, match="^clip: notes.wav is not audio"):
        code, stats, player = handlers.encode_clip(str(notes))
    assert code == "" and stats.startswith("error: clip: notes.wav is not audio") and "/" not in stats
    assert player is None  # the file is taken out of the clip player
    clip = tmp_path / "voice.wav"
    with wave.open(str(clip), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000)
        w.writeframes(b"\0\1" * 36000)
    code, stats, _ = handlers.encode_clip(str(clip))
    assert code == "codes of 36000" and stats.startswith("clip encoded: 1.5 s")


class StreamingPipeline(RecordingPipeline):
    """stream() yields an engine stream's chunks: a 0.1 s first chunk, then 0.5 s ones."""

    def stream(self, job: SynthesisJob):
        return iter([[np.full(n, 0.1, np.float32)] for n in (2400, 12000, 12000)])


def test_the_live_player_opens_on_enough_audio_for_a_segment() -> None:
    from webui.handlers import FIRST_LIVE_SAMPLES

    updates = list(Handlers(StreamingPipeline()).generate_stream(*_request(refine=False)))
    live = [u[0][1] for u in updates if isinstance(u[0], tuple)]
    assert updates[0][0].get("__type__") == "update"  # not None: no empty playlist for the browser to poll
    assert len(live[0]) >= FIRST_LIVE_SAMPLES and sum(map(len, live)) == 2400 + 12000 + 12000
    assert updates[-1][4].startswith("audio: 1.10 s")


def test_the_start_up_line_names_this_commands_flags_not_gradios_launch() -> None:
    from webui.app import served_at

    local = served_at("http://127.0.0.1:7860/", None)
    assert "http://127.0.0.1:7860/" in local and "--share" in local and "share=True" not in local
    shared = served_at("http://127.0.0.1:7860/", "https://x.gradio.live")
    assert "public link: https://x.gradio.live" in shared


def test_a_speaker_for_another_model_is_refused_by_the_front_end() -> None:
    pipeline = RecordingPipeline()
    wrong = encode_spk_emb(torch.randn(HIDDEN + 3))
    with pytest.warns(UserWarning, match="^speaker: "):
        *_, stats = _final(Handlers(pipeline), speaker=wrong, audio_seed=None, refine=False)
    assert stats.startswith(f"error: speaker: this speaker has {HIDDEN + 3} values but the model needs {HIDDEN}")
    assert pipeline.calls == []


class EndlessStreamPipeline(RecordingPipeline):
    """stream() sends 1 s of audio, then more until its run's stop flag is set (10 s at most)."""

    def __init__(self) -> None:
        super().__init__()
        self.stops: list = []

    def stream(self, job: SynthesisJob):
        stop = job.stop
        self.stops.append(stop)
        yield [np.full(24000, 0.1, np.float32)]
        for _ in range(1000):
            if stop():
                return
            time.sleep(0.01)
            yield [np.zeros(0, np.float32)]


def test_a_new_run_never_revives_an_abandoned_stream() -> None:
    pipeline = EndlessStreamPipeline()
    handlers = Handlers(pipeline)
    run = handlers.generate_stream(*_request(refine=False))
    next(update for update in run if isinstance(update[0], tuple))  # the first live chunk is out
    run.close()  # the browser went away mid-stream
    (abandoned,) = pipeline.stops
    assert abandoned()
    *_, stats = _final(handlers, refine=False)  # the next run gets its own stop flag
    assert stats.startswith("audio: ") and abandoned()


def test_the_speaker_field_takes_presets_and_seeds_as_the_server_does_with_its_words() -> None:
    from chattts_velocity.text.voices import PRESET_SEEDS, voice_params

    pipeline = RecordingPipeline()
    _final(Handlers(pipeline), speaker="alloy", audio_seed=None, refine=False)
    _final(Handlers(pipeline), speaker="42", audio_seed=None, refine=False)
    used = [c["params"].spk_emb for c in pipeline.calls]
    assert used == [pipeline.speakers.random(PRESET_SEEDS["alloy"]), pipeline.speakers.random(42)]
    with pytest.raises(ValueError) as server:
        voice_params("nobody", None, pipeline.speakers.random)
    with pytest.warns(UserWarning):
        *_, stats = _final(Handlers(pipeline), speaker="nobody", audio_seed=None, refine=False)
    assert stats.startswith(f"error: {server.value}")  # the server's and the export's words


def test_the_speaker_field_takes_a_saved_voices_name_as_the_server_does(tmp_path: Path) -> None:
    from chattts_velocity.text.voices import VoiceLibrary

    pipeline, library = RecordingPipeline(), VoiceLibrary(tmp_path / "voices")
    speaker = pipeline.speakers.random(7)
    library.save("Anna", speaker=speaker)
    _final(Handlers(pipeline, voices=library), speaker="Anna", audio_seed=None, refine=False)
    assert [c["params"].spk_emb for c in pipeline.calls] == [speaker]
