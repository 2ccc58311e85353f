"""Voice blends: the parser, the mix of speaker vectors (its statistics and its determinism) and its errors, all
through the one resolution every surface uses (text.voices.voice_params)."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.text import decode_spk_emb, encode_prompt, sample_random_speaker
from chattts_velocity.text.blend import MAX_BLEND_PARTS, BlendPart, is_blend, parse_blend
from chattts_velocity.text.speaker import speaker_stats
from chattts_velocity.text.voices import PRESET_SEEDS, VoiceLibrary, voice_params

DIM = 64


def draw(seed: int) -> str:
    return sample_random_speaker(DIM, seed=seed)


def speaker(voice: object, library: VoiceLibrary | None = None) -> str:
    found = voice_params(voice, library, draw)["spk_emb"]
    assert found is not None
    return found


def test_the_parser_reads_names_seeds_and_weights() -> None:
    assert parse_blend("alloy(2)+1234(1)") == [BlendPart("alloy", 2.0), BlendPart("1234", 1.0)]
    assert parse_blend(" echo + Anna Reads-1.0 ( 0.25 ) ") == [BlendPart("echo", 1.0),
                                                               BlendPart("Anna Reads-1.0", 0.25)]
    assert is_blend("alloy(2)") and is_blend("a+b") and not is_blend("alloy") and not is_blend("1234")


@pytest.mark.parametrize("voice, says", [
    ("alloy(0)+echo", "weight of 'alloy'"), ("alloy(-1)+echo", "weight"), ("alloy(nan)+echo", "weight"),
    ("alloy(inf)+echo", "weight"), ("alloy(1e400)+echo", "weight"), ("alloy(2000)+echo", "weight"),
    ("alloy()+echo", "weight"), ("alloy+", "not a blend part"), ("+echo", "not a blend part"),
    ("alloy(2", "not a blend part"), ("alloy)2(", "not a blend part"), ("(2)", "not a blend part"),
    ("alloy(2)x+echo", "not a blend part"), ("+".join(["alloy"] * (MAX_BLEND_PARTS + 1)), "at most"),
    ("alloy+nobody", "blend part 'nobody': unknown voice"), ("alloy+99999999999", "blend part '99999999999'"),
])
def test_bad_blends_are_refused_naming_voice(voice, says) -> None:
    with pytest.raises(ValueError, match="^voice: ") as err:
        voice_params(voice, None, draw)
    assert says in str(err.value)


def test_a_blend_is_the_documented_mix_of_its_parts_vectors() -> None:
    a, b = (decode_spk_emb(draw(seed)).float() for seed in (PRESET_SEEDS["alloy"], 1234))
    mean = speaker_stats(DIM)[1].float()
    mixed = decode_spk_emb(speaker("alloy(2)+1234(1)")).float()
    w = torch.tensor([2 / 3, 1 / 3])
    expected = mean + (w[0] * (a - mean) + w[1] * (b - mean)) / w.norm()
    assert torch.allclose(mixed, expected, atol=2e-2 * float(expected.abs().max()))  # float16 storage
    assert not torch.equal(mixed, a) and not torch.equal(mixed, b)


@pytest.mark.slow  # several seconds: the default suite stays within its time
def test_a_mix_keeps_a_random_speakers_spread_around_the_mean() -> None:
    std, mean = (t.float() for t in speaker_stats(DIM))
    mixes = torch.stack([decode_spk_emb(speaker(f"{s}(1)+{s + 1000}(3)+{s + 2000}(2)")).float()
                         for s in range(40)])  # [40, DIM]
    singles = torch.stack([decode_spk_emb(draw(s)).float() for s in range(40)])
    spread_mix = ((mixes - mean) / std).pow(2).mean().sqrt()
    spread_one = ((singles - mean) / std).pow(2).mean().sqrt()
    assert abs(float(spread_mix) - float(spread_one)) < 0.2 * float(spread_one)  # a plain average shrinks it ~0.6x


def test_the_same_blend_text_is_the_same_speaker_and_weights_matter() -> None:
    first = speaker("alloy(2)+1234(1)")
    assert speaker("alloy(2)+1234(1)") == first == speaker(" alloy ( 2 ) + 1234 ( 1 ) ")
    assert speaker("alloy(4)+1234(2)") == first  # only the ratio counts
    assert speaker("alloy(1)+1234(2)") != first


def test_one_distinct_part_is_that_voice_unchanged() -> None:
    assert speaker("alloy(3)") == speaker("alloy") == speaker("alloy+alloy(2)")


def test_saved_voices_and_speaker_strings_blend_and_clips_do_not(tmp_path) -> None:
    library = VoiceLibrary(tmp_path)
    library.save("narrator", speaker=draw(5))
    library.save("cloned", clip_code=encode_prompt(torch.randint(0, 625, (4, 20))), transcript="hi")
    by_name = speaker("narrator(1)+echo(1)", library)
    assert by_name == speaker(f"{draw(5)}(1)+echo(1)", library)
    assert voice_params({"id": "narrator+echo"}, library, draw)["spk_emb"] == by_name
    with pytest.raises(ValueError, match="^voice: blend part 'cloned' has no speaker vector"):
        voice_params("cloned+echo", library, draw)


def test_parts_of_different_widths_do_not_blend() -> None:
    with pytest.raises(ValueError, match="^voice: .*different widths"):
        voice_params(f"{sample_random_speaker(32, seed=1)}+echo", None, draw)
