"""Drive the web UI in Chromium like a person (type, press keys on sliders, pick options, click) and read
back what the page shows; shared by the web UI e2e tests."""
from __future__ import annotations

import io
import re
import urllib.request
import wave
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
TINY_HIDDEN = 64  # tiny checkpoint width (team brief): speaker strings hold 64 values
FINISHED = r"^(audio|error):|^interrupted"  # the stats box once a run has ended
# The collapsed groups of the page, outer before inner; closed ones do not render their controls.
GROUPS = ("group-voice", "group-clone", "group-library", "group-style", "group-options")


def open_group(page, group: str) -> None:
    """Open one collapsed group, as a person clicks its title; an open one stays open."""
    title = page.locator(f"#{group} > button.label-wrap")
    if "open" not in (title.get_attribute("class") or "").split():
        title.click()
    page.wait_for_function("(g) => document.querySelector(`#${g} > button.label-wrap`).classList.contains('open')",
                           arg=group)


def open_groups(page) -> None:
    for group in GROUPS:
        open_group(page, group)


def stats(page) -> str:
    return page.locator("#stats textarea").input_value()


def generate(page, button: str = "#generate") -> str:
    """Click Generate, wait for the final stats and for the page to be idle again (Interrupt off)."""
    page.evaluate("() => { document.querySelector('#stats textarea').value = ''; }")  # drop the last run's text
    page.locator(button).click()
    page.wait_for_function("(re) => new RegExp(re).test(document.querySelector('#stats textarea').value)",
                           arg=FINISHED)
    page.wait_for_function("() => document.querySelector('#interrupt').disabled")
    return stats(page)


def audio_seconds(text: str) -> float:
    return float(re.search(r"^audio: ([0-9.]+) s", text, re.M).group(1))


def fetch(href: str) -> bytes:
    with urllib.request.urlopen(href, timeout=30) as r:
        return r.read()


def fetch_output_wav(page) -> tuple[str, wave.Wave_read]:
    link = page.locator("#output-audio a.download-link")
    link.wait_for()
    href = link.get_attribute("href")
    return href, wave.open(io.BytesIO(fetch(href)))


def fetch_download(page) -> tuple[str, bytes]:
    """-> (file name, bytes) of the Download box, the file in the chosen format."""
    link = page.locator("#download a.download-link")
    link.wait_for()
    href = link.get_attribute("href")
    return href.rsplit("/", 1)[-1], fetch(href)


def browser_duration(page, href: str) -> float:
    """Let Chromium itself load and decode the file; a broken file rejects."""
    return page.evaluate("""async (href) => {
        const a = new Audio(); a.preload = 'auto';
        await new Promise((ok, bad) => { a.onloadedmetadata = ok;
            a.onerror = () => bad(new Error('audio error ' + (a.error && a.error.code))); a.src = href; });
        return a.duration; }""", href)


def set_slider(page, elem_id: str, value: int) -> None:
    """Keyboard on the range thumb, as a person without a mouse would: Home, then one step right per level."""
    thumb = page.locator(f"#{elem_id} input[type=range]")
    thumb.focus()
    thumb.press("Home")
    for _ in range(value):
        thumb.press("ArrowRight")
    page.wait_for_function("([id, v]) => document.querySelector(`#${id} input[type=number]`).value === v",
                           arg=[elem_id, str(value)])


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()
    page.wait_for_function("([id, v]) => document.querySelector(`#${id} input`).value === v",
                           arg=[elem_id, option])


def type_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input")
    box.fill(str(value))
    box.press("Tab")


def expected_speaker(seed: int) -> str:
    from chattts_velocity.text import sample_random_speaker, seed_context

    with seed_context(seed):
        return sample_random_speaker(TINY_HIDDEN)


def assert_no_traceback(page, server) -> None:
    assert "Traceback" not in page.locator("body").inner_text()
    assert "Traceback" not in server.log.read_text()
