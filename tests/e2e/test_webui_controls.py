"""Web UI controls in real Chromium: each is driven like a person and must change what the page makes
(audio, refined text, the downloaded file), not only render; screenshots at desktop and phone width."""
from __future__ import annotations

import re

import pytest
from page_driver import (
    ARTIFACTS,
    FINISHED,
    GROUPS,
    assert_no_traceback,
    browser_duration,
    expected_speaker,
    fetch_download,
    fetch_output_wav,
    generate,
    open_group,
    open_groups,
    pick,
    set_slider,
    type_number,
)

pytestmark = pytest.mark.e2e
MAGIC = {"wav": b"RIFF", "flac": b"fLaC", "ogg": b"OggS", "opus": b"OggS"}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(autouse=True)
def _groups_open(webui_page) -> None:
    """These tests drive every control, so the page's collapsed groups are opened first."""
    open_groups(webui_page)


def _voice(page, text: str, refine: bool) -> None:
    """Same text, the Default voice (audio seed 2), text seed 42, speed 5, wav: a fixed starting point."""
    page.locator("#input-text textarea").fill(text)
    pick(page, "voice-preset", "default")
    type_number(page, "text-seed", 42)
    page.locator("#refine input").set_checked(refine)
    set_slider(page, "speed", 5)
    pick(page, "format", "wav")


def _output_wav_bytes(page) -> bytes:
    _, wav = fetch_output_wav(page)
    return wav.readframes(wav.getnframes())


def test_an_example_sets_text_speed_levels_and_seeds(webui_page) -> None:
    page = webui_page
    page.get_by_text("欢迎使用这个语音合成引擎 (chatty").click()
    page.wait_for_function("() => document.querySelector('#audio-seed input').value === '3333'")
    assert page.locator("#input-text textarea").input_value().startswith("欢迎使用这个语音合成引擎")
    values = {i: page.locator(f"#{i} input").first.input_value() for i in ("speed", "oral", "laugh", "break")}
    assert values == {"speed": "7", "oral": "6", "laugh": "2", "break": "5"}
    page.wait_for_function("() => document.querySelector('#voice-preset input').value === 'ballad'")
    page.wait_for_function("() => document.querySelector('#refine-prompt textarea').value"
                           " === '[oral_6][laugh_2][break_5]'")


def test_speed_changes_the_audio_and_the_same_settings_repeat_it(webui_page, webui_server) -> None:
    page = webui_page
    _voice(page, "Speed is a prompt tag the model reads.", refine=False)
    made = {}
    for speed in (2, 8, 2):
        set_slider(page, "speed", speed)
        assert generate(page).startswith("audio:")
        made.setdefault(speed, []).append(_output_wav_bytes(page))
    assert made[2][0] == made[2][1]  # same seeds, same speed: the same audio
    assert made[2][0] != made[8][0]  # only the speed differs
    assert_no_traceback(page, webui_server)


def test_refine_levels_change_the_refined_text(webui_page) -> None:
    page = webui_page
    _voice(page, "Hello world, this is a test of the page.", refine=True)  # tiny weights refine it to words
    refined = {}
    for oral, laugh, pause in ((0, 0, 0), (9, 2, 7)):
        for elem_id, level in (("oral", oral), ("laugh", laugh), ("break", pause)):
            set_slider(page, elem_id, level)
        prompt = f"[oral_{oral}][laugh_{laugh}][break_{pause}]"
        page.wait_for_function("(p) => document.querySelector('#refine-prompt textarea').value === p", arg=prompt)
        assert generate(page).startswith("audio:")
        refined[prompt] = page.locator("#refined textarea").input_value()
    assert len(set(refined.values())) == 2, refined
    page.locator("#refine input").uncheck()
    # levels only matter to the refine pass; the page disables them after a server round trip, so wait for it
    page.wait_for_function("() => document.querySelector('#oral input[type=range]').disabled")
    page.locator("#refine input").check()


@pytest.mark.parametrize("fmt", ["mp3", "flac", "ogg", "pcm", "wav"])
def test_format_choice_changes_the_downloaded_file(webui_page, fmt: str) -> None:
    page = webui_page
    _voice(page, "The download follows the format box.", refine=False)
    pick(page, "format", fmt)
    assert generate(page).startswith("audio:")
    name, data = fetch_download(page)
    assert name == f"speech.{fmt}"
    frames = len(_output_wav_bytes(page)) // 2  # the player always gets 16-bit WAV
    if fmt == "pcm":
        assert len(data) == 2 * frames
    elif fmt == "mp3":
        assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
    else:
        assert data[:4] == MAGIC[fmt]
    if fmt != "pcm":  # Chromium decodes the file to the same length (mp3/ogg add a little padding)
        href = page.locator("#download a.download-link").get_attribute("href")
        assert abs(browser_duration(page, href) - frames / 24000) < 0.1


def test_autoplay_follows_its_checkbox(webui_page) -> None:
    page = webui_page
    _voice(page, "Auto-play starts the result.", refine=False)
    page.locator("#autoplay input").uncheck()
    assert generate(page).startswith("audio:")
    page.locator("#output-audio button[aria-label=Play]").wait_for()
    page.wait_for_timeout(1500)  # a late auto-play would flip the button to Pause; it must not
    assert page.locator("#output-audio button[aria-label=Play]").count() == 1
    page.locator("#autoplay input").check()
    assert generate(page).startswith("audio:")
    page.locator("#output-audio button[aria-label=Pause]").wait_for()  # playing (the page's 120 s deadline)


def test_interrupt_is_enabled_only_while_generating(webui_page, webui_server) -> None:
    page = webui_page
    assert page.locator("#interrupt").is_disabled()
    _voice(page, " ".join(["This long text keeps the engine busy for a while."] * 40), refine=True)
    page.evaluate("() => { document.querySelector('#stats textarea').value = ''; }")
    page.locator("#generate").click()
    page.wait_for_function("() => !document.querySelector('#interrupt').disabled")
    assert page.locator("#generate").is_disabled()  # no second run on top of the first
    page.locator("#interrupt").click()
    page.wait_for_function("() => /^(audio|error):|^interrupted/.test(document.querySelector('#stats textarea')"
                           ".value)")
    assert page.locator("#stats textarea").input_value().startswith("interrupted")  # not a normal finish
    page.wait_for_function("() => document.querySelector('#interrupt').disabled")
    assert page.locator("#generate").is_enabled()
    assert_no_traceback(page, webui_server)


# Every status tracker that leaves its hidden state during a run, by the id of the block it sits in.
WATCH_PROGRESS = """() => { window.progressShownOn = new Set();
  const note = () => document.querySelectorAll('[data-testid=status-tracker]').forEach(t => {
    if (!t.classList.contains('hide')) window.progressShownOn.add((t.closest('[id]') || {}).id); });
  window.progressWatch = new MutationObserver(note);
  window.progressWatch.observe(document.body, {subtree: true, attributes: true, attributeFilter: ['class']}); }"""


def test_a_run_shows_one_progress_display(webui_page) -> None:
    page = webui_page
    _voice(page, " ".join(["One progress display, in the stats box."] * 6), refine=True)
    page.evaluate(WATCH_PROGRESS)
    shown: list[str] = []
    page.evaluate("() => { document.querySelector('#stats textarea').value = ''; }")
    page.locator("#generate").click()
    while not re.match(FINISHED, text := page.locator("#stats textarea").input_value()):
        shown.append(text)
        page.wait_for_timeout(50)
    page.evaluate("() => window.progressWatch.disconnect()")
    assert set(page.evaluate("() => [...window.progressShownOn]")) == {"stats"}  # not on audio, download, text
    assert not any(re.search(r"\d+/\d", line) for line in shown)  # no "47/2.0k step" bound


def _same_row(page, box: str, button: str) -> bool:
    b, k = page.locator(box).bounding_box(), page.locator(button).bounding_box()
    return b["y"] <= k["y"] + k["height"] / 2 <= b["y"] + b["height"] and k["x"] + k["width"] <= PHONE["width"]


def test_layout_at_desktop_and_phone_width(webui_page) -> None:
    page = webui_page
    _voice(page, "A screenshot of the page after a run.", refine=True)
    assert generate(page).startswith("audio:")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webui-desktop.png"), full_page=True)
    desktop = page.viewport_size
    try:
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "webui-phone.png"), full_page=True)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
        assert _same_row(page, "#audio-seed", "#audio-dice") and _same_row(page, "#text-seed", "#text-dice")
        assert page.locator("#audio-dice").inner_text().strip() == "🎲 Random voice"
    finally:
        page.set_viewport_size(desktop)


def test_a_phone_sees_generate_and_the_demo_notice_on_its_first_screen(webui_page) -> None:
    page = webui_page
    desktop = page.viewport_size
    try:
        page.set_viewport_size(PHONE)
        page.reload()
        page.wait_for_selector("#generate")
        for group in GROUPS[:1] + GROUPS[2:]:  # the options start collapsed (the clone group sits in voice)
            assert "open" not in page.locator(f"#{group} > button.label-wrap").get_attribute("class").split()
        for primary in ("#input-text", "#voice-preset", "#generate", "#demo-notice"):
            box = page.locator(primary).bounding_box()
            assert box["y"] + box["height"] <= PHONE["height"], primary  # no scrolling past the options
        assert "random audio" in page.locator("#demo-notice").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "webui-phone-first-screen.png"))
    finally:
        page.set_viewport_size(desktop)
        page.reload()
        page.wait_for_selector("#generate")
        open_groups(page)


def test_error_toast_stays_clear_of_the_controls(webui_page) -> None:
    page = webui_page
    page.locator("#input-text textarea").fill("  ")
    page.evaluate("() => window.scrollTo(0, 0)")
    assert generate(page).startswith("error: text:")
    toast = page.locator(".toast-body").filter(has_text="empty").first
    toast.wait_for()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "webui-toast.png"))
    t = toast.bounding_box()
    for control in ("#split-text", "#stream", "#autoplay", "#generate", "#refine", "#input-text"):
        c = page.locator(control).bounding_box()
        overlap = t["x"] < c["x"] + c["width"] and c["x"] < t["x"] + t["width"] and \
            t["y"] < c["y"] + c["height"] and c["y"] < t["y"] + t["height"]
        assert not overlap, control


def _answered(page, line: str) -> None:
    """A page action answers in the page: the line in Run stats, and a toast with its message."""
    page.wait_for_function("(s) => document.querySelector('#stats textarea').value.startsWith(s)", arg=line)
    page.locator(".toast-body").filter(has_text=line.removeprefix("error: ").split(": ", 1)[-1]).first.wait_for()


def test_voice_library_save_pick_and_delete(webui_page, webui_server) -> None:
    from chattts_velocity.text.voices import VoiceLibrary

    page = webui_page
    VoiceLibrary(webui_server.voices).save("From the API", speaker=expected_speaker(4444))  # made elsewhere
    page.reload()
    page.wait_for_selector("#generate")
    open_groups(page)
    pick(page, "voice-preset", "alloy")
    alloy = expected_speaker(1111)
    page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s", arg=alloy)
    page.locator("#voice-name textarea").fill("Narrator")
    page.locator("#save-voice").click()
    page.wait_for_function("() => document.querySelector('#saved-voices input').value === 'Narrator'")
    assert VoiceLibrary(webui_server.voices).get("Narrator").speaker == alloy  # on disk for the server too
    _answered(page, "saved voice 'Narrator'")
    page.locator("#voice-name textarea").fill("NARRATOR")  # a taken name, in other letters
    page.locator("#save-voice").click()
    _answered(page, "error: name: 'NARRATOR' is taken")
    pick(page, "voice-preset", "default")
    page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s",
                           arg=expected_speaker(2))
    for name, speaker in (("Narrator", alloy), ("From the API", expected_speaker(4444))):
        pick(page, "saved-voices", name)
        page.wait_for_function("(s) => document.querySelector('#speaker textarea').value === s", arg=speaker)
        assert page.locator("#voice-preset input").input_value() == "Custom"
        page.wait_for_function("() => document.querySelector('#audio-seed input').value === ''")  # not default's 2
        _answered(page, f"voice '{name}' picked")
    page.wait_for_timeout(500)  # the cleared seed must not bring a seed's speaker back
    assert page.locator("#speaker textarea").input_value() == expected_speaker(4444)
    page.locator("#input-text textarea").fill("A saved voice speaks.")
    assert generate(page).startswith("audio:")
    pick(page, "saved-voices", "Narrator")
    page.locator("#delete-voice").click()
    page.wait_for_function("() => document.querySelector('#saved-voices input').value === ''")
    _answered(page, "deleted voice 'Narrator'")
    assert "Narrator" not in VoiceLibrary(webui_server.voices)
    page.locator("#saved-voices input").click()
    assert page.get_by_role("option", name="Narrator", exact=True).count() == 0
    page.keyboard.press("Escape")
    assert_no_traceback(page, webui_server)


def test_clone_a_voice_from_the_microphone(webui_page, webui_server) -> None:
    from chattts_velocity.text import decode_prompt

    page = webui_page  # Chromium's fake microphone (conftest flags) plays a beeping tone
    open_group(page, "group-clone")
    page.locator('#clip button[aria-label="Record audio"]').click()
    page.locator("#clip button", has_text="Record").click()
    page.wait_for_timeout(2000)
    page.locator("#clip button:visible", has_text="Stop").first.click()
    page.wait_for_function("() => document.querySelector('#clip-code textarea').value.length > 0")
    codes = decode_prompt(page.locator("#clip-code textarea").input_value())
    assert codes.shape[0] == 4 and codes.shape[1] >= 20  # ~2 s of clip: 1 code per 2 mel frames of 256 samples
    page.locator("#transcript textarea").fill("beep beep")
    page.locator("#input-text textarea").fill("A voice from the microphone.")
    assert generate(page).startswith("audio:")
    assert_no_traceback(page, webui_server)
