"""The voice library: safe names, checked contents, atomic files that survive a new library object, and the one
resolution of a user's `voice` to InferCodeParams keywords."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from chattts_velocity.params import InferCodeParams
from chattts_velocity.text import encode_prompt, sample_random_speaker, seed_context
from chattts_velocity.text.voices import (
    MAX_SPEAKER_CHARS,
    PRESET_SEEDS,
    Voice,
    VoiceLibrary,
    default_root,
    voice_params,
)

with seed_context(7):
    SPEAKER = sample_random_speaker(64)
CLIP = encode_prompt(torch.randint(0, 625, (4, 30)))


def test_a_saved_voice_survives_a_new_library_on_the_same_folder(tmp_path) -> None:
    saved = VoiceLibrary(tmp_path).save("Anna Reads-1.0", speaker=SPEAKER)
    again = VoiceLibrary(tmp_path)
    assert again.get("anna reads-1.0") == saved and "ANNA READS-1.0" in again
    assert [v.name for v in again.list()] == ["Anna Reads-1.0"]
    assert json.loads((tmp_path / "anna reads-1.0.json").read_text())["speaker"] == SPEAKER
    assert not list(tmp_path.glob(".tmp-*"))  # the temp file was renamed in


def test_names_are_case_insensitively_unique_unless_overwritten(tmp_path) -> None:
    lib = VoiceLibrary(tmp_path)
    lib.save("bob", speaker=SPEAKER)
    with pytest.raises(ValueError, match="^name: .*exists"):
        lib.save("BOB", clip_code=CLIP, transcript="hello")
    lib.save("BOB", clip_code=CLIP, transcript="hello", overwrite=True)
    assert lib.get("bob") == Voice("BOB", None, CLIP, "hello", lib.get("bob").created)
    assert len(lib.list()) == 1


@pytest.mark.parametrize("name", ["", " ", "../x", "a/b", "a\\b", ".hidden", "x" * 65, "nul\x00", "é", "a\nb",
                                  "Alloy", "DEFAULT", "1234", None, 5, "~root", "a:b", "*"])
def test_hostile_or_taken_names_are_refused_naming_name(tmp_path, name) -> None:
    with pytest.raises(ValueError, match="^name: "):
        VoiceLibrary(tmp_path).save(name, speaker=SPEAKER)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fields, field", [
    ({}, "speaker"), ({"speaker": "not a speaker"}, "speaker"), ({"speaker": "蘁淰" * MAX_SPEAKER_CHARS}, "speaker"),
    ({"speaker": 5}, "speaker"), ({"clip_code": "蘁淰xyz"}, "clip_code"), ({"clip_code": CLIP}, "transcript"),
    ({"clip_code": CLIP, "transcript": " "}, "transcript"), ({"speaker": SPEAKER, "transcript": "hi"}, "transcript"),
])
def test_unusable_contents_are_refused_naming_the_field(tmp_path, fields, field) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        VoiceLibrary(tmp_path).save("v", **fields)


def test_unknown_voices_name_voice_and_the_limit_holds(tmp_path) -> None:
    lib = VoiceLibrary(tmp_path, max_voices=2)
    for bad in ("nobody", "../etc/passwd", 3):
        with pytest.raises(ValueError, match="^voice: "):
            lib.get(bad)
        with pytest.raises(ValueError, match="^voice: "):
            lib.delete(bad)
        assert bad not in lib
    lib.save("a", speaker=SPEAKER)
    lib.save("b", speaker=SPEAKER)
    with pytest.raises(ValueError, match="^name: .*limit of 2"):
        lib.save("c", speaker=SPEAKER)
    lib.save("a", speaker=SPEAKER, overwrite=True)  # replacing is not growing
    lib.delete("A")
    assert [v.name for v in lib.list()] == ["b"]


def test_a_damaged_file_hides_one_voice_only(tmp_path) -> None:
    lib = VoiceLibrary(tmp_path)
    lib.save("good", speaker=SPEAKER)
    (tmp_path / "bad.json").write_text("{not json")
    assert [v.name for v in lib.list()] == ["good"]


def test_concurrent_saves_of_one_name_keep_exactly_one(tmp_path) -> None:
    lib, errors = VoiceLibrary(tmp_path), []

    def save() -> None:
        try:
            lib.save("race", speaker=SPEAKER)
        except ValueError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 7 and len(lib.list()) == 1


def test_default_root_follows_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CHATTTS_VELOCITY_VOICES", str(tmp_path / "v"))
    assert default_root() == tmp_path / "v" and VoiceLibrary().root == tmp_path / "v"
    monkeypatch.delenv("CHATTTS_VELOCITY_VOICES")
    assert default_root().parts[-2:] == ("chattts_velocity", "voices")


def test_voice_params_resolves_every_form_to_infer_code_keywords(tmp_path) -> None:
    lib = VoiceLibrary(tmp_path)
    lib.save("cloned", clip_code=CLIP, transcript="the words")
    seeds = []

    def for_seed(seed: int) -> str:
        seeds.append(seed)
        return SPEAKER

    assert voice_params({"id": "cloned"}, lib, for_seed) == {"spk_emb": None, "spk_smp": CLIP, "txt_smp": "the words"}
    InferCodeParams(**voice_params("Cloned", lib, for_seed))
    assert voice_params(None, lib, for_seed)["spk_emb"] == SPEAKER
    voice_params("Nova", lib, for_seed), voice_params(42, lib, for_seed), voice_params(" 43 ", lib, for_seed)
    assert seeds == [PRESET_SEEDS["default"], PRESET_SEEDS["nova"], 42, 43]
    assert voice_params(SPEAKER, None, for_seed)["spk_emb"] == SPEAKER
    for bad in ("nobody", {"id": 5}, {"name": "cloned"}, True, 1.5, ["x"]):
        with pytest.raises(ValueError, match="^voice: "):
            voice_params(bad, lib, for_seed)
