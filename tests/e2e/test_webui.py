"""Web UI: numpy clip helpers (fast, no browser) and the Gradio page driven by headless Chromium (e2e)."""
from __future__ import annotations

import io
import re
import shutil
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from chattts_velocity.audio import float_to_int16
from webui.clips import RunStats, resample, to_mono

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
TINY_HIDDEN = 64  # tiny checkpoint width (team brief): speaker strings hold 64 values


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
def _stats(page) -> str:
    return page.locator("#stats textarea").input_value()


def _generate(page, button: str = "#generate") -> str:
    """Click Generate and wait for the final stats ('audio: ...' or 'error: ...')."""
    page.evaluate("() => { document.querySelector('#stats textarea').value = ''; }")  # drop the last run's text
    page.locator(button).click()
    page.wait_for_function("() => /^(audio|error):/.test(document.querySelector('#stats textarea').value)")
    return _stats(page)


def _audio_seconds(stats: str) -> float:
    return float(re.search(r"^audio: ([0-9.]+) s", stats, re.M).group(1))


def _fetch_output_wav(page) -> tuple[str, wave.Wave_read]:
    link = page.locator("#output-audio a.download-link")
    link.wait_for()
    href = link.get_attribute("href")
    with urllib.request.urlopen(href, timeout=30) as r:
        return href, wave.open(io.BytesIO(r.read()))


def _browser_duration(page, href: str) -> float:
    """Let Chromium itself load and decode the file; a broken file rejects."""
    return page.evaluate("""async (href) => {
        const a = new Audio(); a.preload = 'auto';
        await new Promise((ok, bad) => { a.onloadedmetadata = ok;
            a.onerror = () => bad(new Error('audio error ' + (a.error && a.error.code))); a.src = href; });
        return a.duration; }""", href)


def _expected_speaker(seed: int) -> str:
    from chattts_velocity.text import sample_random_speaker, seed_context

    with seed_context(seed):
        return sample_random_speaker(TINY_HIDDEN)


def _assert_no_traceback(page, server) -> None:
    assert "Traceback" not in page.locator("body").inner_text()
    assert "Traceback" not in server.log.read_text()


@pytest.mark.e2e
def test_page_shows_controls_examples_and_seeded_speaker(webui_page) -> None:
    page = webui_page
    assert page.title() == "ChatTTS velocity"
    for text in ("今天天气真不错", "Speech synthesis turns", "欢迎使用这个语音合成引擎"):
        assert page.get_by_text(text).count() >= 1
    for label in ("Temperature", "top_P", "top_K", "Refine text", "Stream", "Interrupt"):
        assert page.get_by_text(label, exact=True).count() >= 1
    assert page.locator("#audio-seed input").input_value() == "2"
    assert page.locator("#speaker textarea").input_value() == _expected_speaker(2)
    assert page.locator("#live-audio").is_hidden()  # the page CSS (passed to launch) hides it until Stream is on


@pytest.mark.e2e
def test_empty_text_shows_a_message_not_a_traceback(webui_page, webui_server) -> None:
    page = webui_page
    page.locator("#input-text textarea").fill("   ")
    stats = _generate(page)
    assert stats.startswith("error: text:") and "empty" in stats
    toast = page.locator(".toast-body").filter(has_text="empty")
    toast.first.wait_for()
    _assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_bad_speaker_string_is_rejected_on_generate(webui_page, webui_server) -> None:
    page = webui_page
    page.locator("#input-text textarea").fill("Hello there.")
    page.locator("#speaker textarea").fill("not a speaker string")
    stats = _generate(page)
    assert stats.startswith("error: speaker:")
    _assert_no_traceback(page, webui_server)


@pytest.mark.e2e
def test_preset_and_dice_regenerate_the_speaker(webui_page) -> None:
    page = webui_page
    page.locator("#voice-preset input").click()
    page.get_by_role("option", name="Timbre 1").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value === '1111'")
    want = _expected_speaker(1111)
    page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s", arg=want)
    page.locator("#audio-dice").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value !== '1111'")
    seed = int(page.locator("#audio-seed input").input_value())
    page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s",
                           arg=_expected_speaker(seed))


@pytest.mark.e2e
def test_generate_gives_a_playable_wav(webui_page, webui_server) -> None:
    page = webui_page
    page.locator("#voice-preset input").click()
    page.get_by_role("option", name="Default").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value === '2'")
    page.locator("#input-text textarea").fill("Hello world, 你好。")
    stats = _generate(page)
    assert stats.startswith("audio:"), stats
    href, wav = _fetch_output_wav(page)
    assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 24000)
    assert wav.getnframes() > 0
    seconds = wav.getnframes() / 24000
    assert abs(seconds - _audio_seconds(stats)) < 0.006
    assert abs(_browser_duration(page, href) - seconds) < 0.01
    assert page.locator("#refined textarea").input_value().strip()  # the refine pass ran and showed its text
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webui.png"), full_page=True)
    _assert_no_traceback(page, webui_server)


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
    stats = _generate(page, "#generate-stream")
    assert stats.startswith("audio:"), stats
    # Chromium's live player (HLS of AAC segments in a blob-backed <audio>) received every chunk:
    # its media duration reaches the streamed length (AAC adds a little padding, never less).
    page.wait_for_function(
        "(s) => { const a = document.querySelector('#live-audio audio');"
        " return a && a.src.startsWith('blob:') && a.duration >= s; }", arg=_audio_seconds(stats) - 0.02)
    _, wav = _fetch_output_wav(page)
    assert abs(wav.getnframes() / 24000 - _audio_seconds(stats)) < 0.006
    assert page.locator("#refined textarea").input_value() == "Streaming sends audio as soon as it is ready."
    stream.uncheck()
    _assert_no_traceback(page, webui_server)


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
    page.get_by_text("Clone a voice (optional)").click()
    page.locator("#clip input[type=file]").set_input_files(str(clip))
    page.wait_for_function("() => document.querySelector('#clip-code textarea').value.length > 0")
    codes = decode_prompt(page.locator("#clip-code textarea").input_value())
    assert tuple(codes.shape) == (4, (1 + 36000 // 256) // 2)  # DVAE: one code per 2 mel frames (hop 256)
    page.locator("#input-text textarea").fill("A cloned voice.")
    assert _generate(page).startswith("error: clip transcript:")
    page.locator("#transcript textarea").fill("some words")
    stats = _generate(page)
    assert stats.startswith("audio:"), stats
    _assert_no_traceback(page, webui_server)
