"""Web UI: numpy clip helpers (fast, no browser) and the Gradio page driven by headless Chromium (e2e)."""
from __future__ import annotations

import shutil
import wave
from pathlib import Path

import numpy as np
import pytest
from page_driver import (
    ARTIFACTS,
    assert_no_traceback,
    audio_seconds,
    browser_duration,
    expected_speaker,
    fetch_output_wav,
    generate,
    open_group,
    open_groups,
)

from chattts_velocity.audio import float_to_int16
from webui.clips import RunStats, resample, to_mono


# ---- clip helpers (no browser) -----------------------------------------------------------------
@pytest.mark.parametrize("rate_in", [44100, 16000, 48000])
def test_resample_matches_the_analytic_sine(rate_in: int) -> None:
    f = 440.0
    x = np.sin(2 * np.pi * f * np.arange(rate_in) / rate_in)
    y = resample(x, rate_in, 24000)
    assert len(y) == 24000
    want = np.sin(2 * np.pi * f * np.arange(24000) / 24000)
    inner = slice(100, -100)  # the kernel sees zero padding at both ends
    assert np.max(np.abs(y[inner] - want[inner])) < 2e-3


def test_resample_removes_tones_above_the_new_nyquist() -> None:
    x = np.sin(2 * np.pi * 15000 * np.arange(48000) / 48000)  # 15 kHz > 12 kHz, would alias to 9 kHz
    y = resample(x, 48000, 24000)[200:-200]
    assert np.sqrt(np.mean(y**2)) < 0.02 * np.sqrt(0.5)


def test_to_mono_averages_channels_and_scales_pcm() -> None:
    pcm = np.array([[32767, -32768], [16384, 16384], [0, -16384]], dtype=np.int16)  # [N, 2]
    want = pcm.astype(np.float64).mean(axis=1) / 32768
    np.testing.assert_allclose(to_mono(pcm), want, atol=1e-7)


def test_run_stats_real_time_factor() -> None:
    stats = RunStats(start=10.0)
    stats.add(0, 10.5)  # empty chunks do not count as first audio
    stats.add(48000, 11.0)
    text = stats.summary(now=12.0)
    assert "audio: 2.00 s" in text and "wall: 2.00 s" in text
    assert "time to first audio: 1.00 s" in text and "real-time factor: 1.000" in text


# ---- browser (e2e) ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _groups_open(request) -> None:
    """Browser tests drive every control, so the page's collapsed groups are opened first."""
    if "webui_page" in request.fixturenames:
        open_groups(request.getfixturevalue("webui_page"))


@pytest.mark.e2e
def test_page_shows_controls_examples_and_seeded_speaker(webui_page) -> None:
    page = webui_page
    assert page.title() == "ChatTTS velocity"
    for text in ("今天天气真不错", "Speech synthesis turns", "欢迎使用这个语音合成引擎"):
        assert page.get_by_text(text).count() >= 1
    for label in ("Temperature", "top_P", "top_K", "Refine text", "Stream", "Interrupt", "Speed", "Oral", "Laugh",
                  "Break", "Split long text", "Batch size", "Auto-play", "Download format"):
        assert page.get_by_text(label, exact=True).count() >= 1
    assert page.locator("#interrupt").is_disabled()  # nothing to interrupt yet
    assert page.locator("#refine-prompt textarea").input_value() == "[oral_2][laugh_0][break_6]"
    assert page.locator("#audio-seed input").input_value() == "2"
    assert page.locator("#speaker textarea").input_value() == expected_speaker(2)
    assert page.locator("#live-audio").is_hidden()  # the page CSS (passed to launch) hides it until Stream is on


@pytest.mark.e2e
def test_empty_text_shows_a_message_not_a_traceback(webui_page, webui_server) -> None:
    page = webui_page
    page.locator("#input-text textarea").fill("   ")
    stats = generate(page)
    assert stats.startswith("error: text:") and "empty" in stats
    toast = page.locator(".toast-body").filter(has_text="empty")
    toast.first.wait_for()
    assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_bad_speaker_string_is_rejected_ongenerate(webui_page, webui_server) -> None:
    page = webui_page
    page.locator("#input-text textarea").fill("Hello there.")
    page.locator("#speaker textarea").fill("not a speaker string")
    stats = generate(page)
    assert stats.startswith("error: voice: unknown voice 'not a speaker string'")  # the server's and export's words
    assert "Random voice" in stats
    assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_preset_and_dice_regenerate_the_speaker(webui_page) -> None:
    page = webui_page
    page.locator("#voice-preset input").click()
    page.get_by_role("option", name="alloy").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value === '1111'")
    want = expected_speaker(1111)
    page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s", arg=want)
    page.locator("#audio-dice").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value !== '1111'")
    seed = int(page.locator("#audio-seed input").input_value())
    page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s",
                           arg=expected_speaker(seed))
    page.wait_for_function("() => document.querySelector('#voice-preset input').value === 'Custom'")


@pytest.mark.e2e
def test_a_bad_audio_seed_answers_in_the_page(webui_page, webui_server) -> None:
    page = webui_page
    speaker = page.locator("#speaker textarea").input_value()
    box = page.locator("#audio-seed input")
    box.fill("-1")
    box.press("Tab")
    page.wait_for_function("() => document.querySelector('#stats textarea').value.startsWith('error: audio seed:')")
    page.locator(".toast-body").filter(has_text="audio seed:").first.wait_for()
    assert page.locator("#speaker textarea").input_value() == speaker  # the voice is left as it was
    assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_generate_gives_a_playable_wav(webui_page, webui_server) -> None:
    page = webui_page
    page.locator("#voice-preset input").click()
    page.get_by_role("option", name="default").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value === '2'")
    page.locator("#input-text textarea").fill("Hello world, 你好。")
    stats = generate(page)
    assert stats.startswith("audio:"), stats
    href, wav = fetch_output_wav(page)
    assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
    assert wav.getnframes() > 0
    seconds = wav.getnframes() / 24000
    assert abs(seconds - audio_seconds(stats)) < 0.006
    assert abs(browser_duration(page, href) - seconds) < 0.01
    assert page.locator("#refined textarea").input_value().strip()  # the refine pass ran and showed its text
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webui.png"), full_page=True)
    assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_stream_plays_chunks_then_gives_the_full_wav(webui_page, webui_server) -> None:
    page = webui_page
    stream = page.locator("#stream input")
    if shutil.which("ffmpeg") is None:  # gradio encodes stream chunks with ffmpeg
        assert stream.is_disabled()
        assert page.get_by_text("streaming needs ffmpeg on the server").count() == 1
        return
    stream.check()
    page.locator("#generate-stream").wait_for()
    assert page.locator("#generate").is_hidden()
    page.locator("#refine input").uncheck()
    page.locator("#input-text textarea").fill("Streaming sends audio as soon as it is ready.")
    assert page.locator("#live-audio").is_hidden()  # shown only while a stream runs
    errors: list[str] = []

    def log_errors(message) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", log_errors)
    try:
        stats = generate(page, "#generate-stream")
    finally:
        page.remove_listener("console", log_errors)
    assert errors == []  # e.g. no HLS "No Segments found in Playlist" while the first chunk is made
    assert stats.startswith("audio:"), stats
    # Chromium's live player (HLS of AAC segments in a blob-backed <audio>) received every chunk:
    # its media duration reaches the streamed length (AAC adds a little padding, never less).
    page.wait_for_function(
        "(s) => { const a = document.querySelector('#live-audio audio');"
        " return a && a.src.startsWith('blob:') && a.duration >= s; }", arg=audio_seconds(stats) - 0.02)
    _, wav = fetch_output_wav(page)
    assert abs(wav.getnframes() / 24000 - audio_seconds(stats)) < 0.006
    assert page.locator("#refined textarea").input_value() == "Streaming sends audio as soon as it is ready."
    page.wait_for_function("() => !document.querySelector('#live-audio').checkVisibility()")  # no leftover player
    page.wait_for_timeout(1000)  # the full audio must not start over the live audio, which may still play
    assert page.locator("#output-audio button[aria-label=Play]").count() == 1
    stream.uncheck()
    assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_a_file_that_is_not_audio_is_named_in_the_page(webui_page, webui_server, tmp_path: Path) -> None:
    page = webui_page
    notes = tmp_path / "notes.wav"
    notes.write_text("these are notes, not audio\n" * 40)
    page.locator("#clip input[type=file]").set_input_files(str(notes))
    page.wait_for_function("() => document.querySelector('#stats textarea').value.startsWith('error: clip:')")
    stats = page.locator("#stats textarea").input_value()
    assert stats.startswith("error: clip: notes.wav is not audio") and "object at 0x" not in stats
    assert str(tmp_path) not in stats and page.locator("#clip-code textarea").input_value() == ""
    page.locator(".toast-body").filter(has_text="notes.wav is not audio").first.wait_for()
    page.locator("#clip input[type=file]").wait_for(state="attached")  # the player is empty again
    assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_clone_a_voice_from_an_uploaded_clip(webui_page, webui_server, tmp_path: Path) -> None:
    from chattts_velocity.text import decode_prompt

    page = webui_page
    rate, n = 44100, 66150  # 1.5 s of 44.1 kHz stereo -> 36000 samples at 24 kHz
    t = np.arange(n) / rate
    stereo = np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)], axis=1) * 0.3
    clip = tmp_path / "voice.wav"
    with wave.open(str(clip), "wb") as w:
        w.setnchannels(2), w.setsampwidth(2), w.setframerate(rate)
        w.writeframes(float_to_int16(stereo).tobytes())
    open_group(page, "group-clone")
    page.locator("#clip input[type=file]").set_input_files(str(clip))
    page.wait_for_function("() => document.querySelector('#clip-code textarea').value.length > 0")
    codes = decode_prompt(page.locator("#clip-code textarea").input_value())
    assert tuple(codes.shape) == (4, (1 + 36000 // 256) // 2)  # DVAE: one code per 2 mel frames (hop 256)
    page.wait_for_function("() => document.querySelector('#stats textarea').value.startsWith('clip encoded: 1.5 s')")
    page.locator("#input-text textarea").fill("A cloned voice.")
    assert generate(page).startswith("error: clip transcript:")
    page.locator("#transcript textarea").fill("some words")
    stats = generate(page)
    assert stats.startswith("audio:"), stats
    assert_no_traceback(page, webui_server)

