"""Web UI voice library callbacks without a browser: save the current voice, pick it back, delete it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("gradio")

from chattts_velocity.text import encode_prompt, sample_random_speaker, seed_context  # noqa: E402 (after the importorskip above)
from chattts_velocity.text.voices import VoiceLibrary  # noqa: E402 (after the importorskip above)
from webui.controls import CUSTOM  # noqa: E402 (after the importorskip above)
from webui.library import LibraryHandlers  # noqa: E402 (after the importorskip above)


def _skipped(value: object) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


@pytest.fixture
def library(tmp_path: Path) -> LibraryHandlers:
    return LibraryHandlers(VoiceLibrary(tmp_path / "voices"))


def _speaker(seed: int) -> str:
    with seed_context(seed):
        return sample_random_speaker(64)


def test_save_pick_and_delete_a_speaker_voice(library: LibraryHandlers, tmp_path: Path) -> None:
    speaker = _speaker(5)
    dropdown, name_box, stats = library.save("Narrator", speaker, "", "")
    assert dropdown["choices"] == ["Narrator"] and dropdown["value"] == "Narrator" and name_box == ""
    assert stats == "saved voice 'Narrator'"  # the page's answer: this line in Run stats and a toast
    assert VoiceLibrary(tmp_path / "voices").get("narrator").speaker == speaker  # on disk, for the server too
    *fields, seed, stats = library.pick("Narrator")
    assert fields == [speaker, "", "", CUSTOM] and stats.startswith("voice 'Narrator' picked")
    assert seed is None  # the old seed's speaker is not the picked one: the seed box is cleared
    assert library.delete("Narrator") == ({"__type__": "update", "choices": [], "value": None},
                                          "deleted voice 'Narrator'")
    assert library.names() == []


def test_a_clip_code_is_saved_instead_of_the_speaker(library: LibraryHandlers) -> None:
    clip_code = encode_prompt(torch.arange(40).reshape(4, 10))
    library.save("Cloned", _speaker(6), clip_code, " hello there ")
    assert library.pick("Cloned")[:5] == ("", clip_code, "hello there", CUSTOM, None)  # what Generate would use


@pytest.mark.parametrize(("args", "field"), [(("../etc", "x", "", ""), "name"), (("alloy", "x", "", ""), "name"),
                                             (("Empty", "", "", ""), "speaker"),
                                             (("Bad", "not a speaker", "", ""), "speaker"),
                                             (("NoWords", "", "clip", ""), "clip_code")])
def test_save_refuses_bad_input_with_a_toast(library: LibraryHandlers, args: tuple, field: str) -> None:
    with pytest.warns(UserWarning, match=f"^{field}:"):
        dropdown, name_box, stats = library.save(*args)
    assert _skipped(dropdown) and _skipped(name_box) and library.names() == []
    assert stats.startswith(f"error: {field}:")


def test_a_second_save_under_one_name_is_refused(library: LibraryHandlers) -> None:
    library.save("Twin", _speaker(1), "", "")
    with pytest.warns(UserWarning, match="taken"):
        stats = library.save("twin", _speaker(2), "", "")[2]
    assert stats.startswith("error: name: 'twin' is taken") and "overwrite" not in stats
    assert library.pick("Twin")[0] == _speaker(1)


def test_pick_and_delete_of_a_missing_voice_warn(library: LibraryHandlers) -> None:
    assert all(_skipped(v) for v in library.pick(None))
    with pytest.warns(UserWarning, match="^voice:"):
        *fields, stats = library.pick("Ghost")
    assert all(_skipped(v) for v in fields) and stats.startswith("error: voice:")
    with pytest.warns(UserWarning, match="^voice:"):
        dropdown, stats = library.delete(None)
    assert _skipped(dropdown) and stats.startswith("error: voice:")
