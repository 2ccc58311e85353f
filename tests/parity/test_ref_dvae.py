"""Parity, DVAE: use_decoder=False decoding (codes -> GFSQ -> DVAE -> mel -> Vocos) and sample_audio_speaker
(wav -> mel -> DVAE encoder -> GFSQ codes -> spk_smp) vs chattts 0.2.5 with vector-quantize-pytorch 1.25.2.

Mel and waveform within 1e-4; codes and spk_smp strings identical (errors go to test-artifacts/parity.json).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from chattts_velocity import audio, text
from chattts_velocity.chat import Chat

from .parity_report import max_abs_error, record
from .refclient import RefClient

pytestmark = pytest.mark.parity

TOLERANCE = 1e-4  # max abs error on mel and waveform
MIN_MARGIN = 1e-5  # distance of every FSQ value (O(1)) from a rounding boundary, >> fp32 noise (~1e-6)
FSQ_SCALE = 2.002  # (levels - 1) * (1 + 1e-3) / 2 for levels 5 (vector-quantize-pytorch's FSQ)
STAGE_SCALES = (1.0, 0.25)  # vqp <= 1.25.2: residual stage r works at 4**-r
NEAR_GREEDY = 1e-6
TEXTS = ("你好。", "hello world, this is a parity test.", "今天天气很好[uv_break]我们去公园散步吧，好不好？")
SAMPLE_RATE = audio.SAMPLE_RATE


def tones(seconds: float, seed: int, extra: int = 0, noise: float = 0.05) -> np.ndarray:
    """A 24 kHz mono test clip: two tones, a glide and white noise; `extra` samples beyond whole seconds."""
    n = int(seconds * SAMPLE_RATE) + extra
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SAMPLE_RATE
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.1 * np.sin(2 * np.pi * 1234 * t)
    wav += 0.1 * np.sin(2 * np.pi * (300 + 900 * t / max(t[-1], 1e-9)) * t) + noise * rng.standard_normal(n)
    return wav.astype(np.float32)


def loud_noise(seconds: float, seed: int) -> np.ndarray:
    """Clipped noise at full scale (|x| reaches 1)."""
    rng = np.random.default_rng(seed)
    return np.clip(1.5 * rng.standard_normal(int(seconds * SAMPLE_RATE)), -1, 1).astype(np.float32)


def speaker_string(dim: int, seed: int) -> str:
    """An explicit speaker string (a torch seed is not portable: fp16 randn differs between torch versions)."""
    return text.encode_spk_emb(torch.from_numpy(np.random.default_rng(seed).standard_normal(dim).astype(np.float16)))


@dataclass(frozen=True)
class Clip:
    name: str
    size: str
    wav: np.ndarray = field(repr=False)

    @property
    def id(self) -> str:
        return f"{self.size}-{self.name}"


CLIPS = [
    Clip("tones_1.5s", "tiny", tones(1.5, seed=1)),
    Clip("odd_length", "tiny", tones(0.5, seed=2, extra=77)),
    Clip("loud_noise", "tiny", loud_noise(1.0, seed=3)),
    Clip("tones_1.5s", "full", tones(1.5, seed=1)),
    Clip("odd_length", "full", tones(0.5, seed=2, extra=77)),
]
# use_decoder=False runs: near-greedy code generation, then the DVAE decodes the (zero-padded) code batch
DECODE_PARAMS = {
    "tiny": {"temperature": NEAR_GREEDY, "max_new_token": 200, "spk_emb": speaker_string(64, 4)},  # ends by EOS
    "full": {"temperature": NEAR_GREEDY, "min_new_token": 8, "max_new_token": 8},
}


@dataclass
class Side:
    size: str
    chat: Chat
    reference: dict[str, dict[str, Any]]
    decoded: dict[str, Any] = field(default_factory=dict)  # our use_decoder=False run (computed on demand)


def make_side(ref_client: RefClient, assets: Path, size: str) -> Side:
    tasks: list[dict[str, Any]] = [{"name": f"smp-{c.name}", "kind": "sample_audio_speaker", "wav": c.wav}
                                   for c in CLIPS if c.size == size]
    tasks.append({"name": "decode", "kind": "infer_code", "texts": list(TEXTS), "params": DECODE_PARAMS[size],
                  "decode": ["dvae"]})
    reference = ref_client.run(tasks, asset_root=assets, size=size)
    chat = Chat()
    chat.load(source="custom", custom_path=assets, verify=False)
    return Side(size, chat, reference)


@pytest.fixture(scope="module")
def tiny_side(ref_client: RefClient, tiny_assets: Path) -> Side:
    return make_side(ref_client, tiny_assets, "tiny")


@pytest.fixture(scope="module")
def full_side(ref_client: RefClient, full_assets: Path) -> Side:
    return make_side(ref_client, full_assets, "full")


def test_reference_uses_vqp_1_25_2(tiny_side: Side) -> None:
    """The GFSQ numbers depend on the vector-quantize-pytorch version; ours implement the 1.18.5-1.25.2 ones."""
    versions = json.loads(tiny_side.reference["_meta"]["versions"])
    assert versions["vector-quantize-pytorch"] == "1.25.2", versions
    record("versions", "reference", versions)


def fsq_margin(chat: Chat, wav: np.ndarray) -> float:
    """Smallest distance of a pre-rounding FSQ value from a half-integer (the FSQ formula of vqp 1.18.5-1.25.2).

    Recomputed from the checkpoint's project_in weights on our encoder features: if it is far above float
    noise, both implementations must round every value the same way.
    """
    dvae = chat.dvae
    with torch.inference_mode():
        mel = dvae.preprocessor_mel(torch.from_numpy(wav)) / dvae.coef[0]  # [100, F]
        feats = dvae.encoder(dvae.downsample_conv(mel.unsqueeze(0)))[0].T.double()  # [T, D]
    margins = []
    groups = dvae.vq_layer.quantizer.rvqs
    for chunk, rvq in zip(feats.chunk(len(groups), dim=-1), groups, strict=True):
        weight, bias = rvq.project_in.weight.detach().double(), rvq.project_in.bias.detach().double()
        residual = chunk @ weight.T + bias  # [T, 4]
        for scale in STAGE_SCALES:
            value = torch.tanh(residual / scale) * FSQ_SCALE
            margins.append((0.5 - (value - torch.round(value)).abs()).min().item())
            residual = residual - torch.round(value) / 2 * scale
    return min(margins)


@pytest.mark.parametrize("clip", CLIPS, ids=[c.id for c in CLIPS])
def test_sample_audio_speaker_identical(request: pytest.FixtureRequest, clip: Clip) -> None:
    side: Side = request.getfixturevalue(f"{clip.size}_side")
    ref = side.reference[f"smp-{clip.name}"]
    codes = side.chat.dvae.encode(torch.from_numpy(clip.wav))  # [4, T]
    spk_smp = side.chat.sample_audio_speaker(clip.wav)
    margin = fsq_margin(side.chat, clip.wav)
    same_codes = tuple(codes.shape) == ref["codes"].shape and np.array_equal(codes.numpy(), ref["codes"])
    record("dvae_encode", clip.id, {"codes_identical": same_codes, "spk_smp_identical": spk_smp == ref["spk_smp"],
                                    "frames": int(codes.shape[1]), "min_fsq_margin": margin})
    assert codes.shape[1] == (len(clip.wav) // 256 + 1) // 2, "T = (N // 256 + 1) // 2 (hop 256, 2 frames per code)"
    assert same_codes, f"{clip.id}: codes differ at {np.argwhere(codes.numpy() != ref['codes'])[:5].tolist()}"
    assert spk_smp == ref["spk_smp"], f"{clip.id}: spk_smp strings differ"
    assert np.array_equal(text.decode_prompt(ref["spk_smp"]).numpy(), codes.numpy())
    assert margin >= MIN_MARGIN, f"{clip.id}: an FSQ value is {margin:.1e} from a rounding boundary; pick another clip"


def decoded(side: Side) -> dict[str, Any]:
    """Our use_decoder=False run of the same generation: codes, the padded-batch mel and per-row waveforms."""
    if not side.decoded:
        chat = side.chat
        params = Chat.InferCodeParams(show_tqdm=False, **DECODE_PARAMS[side.size])
        requests = chat.speech_requests(text.split_pieces(list(TEXTS), split=False), params, use_decoder=False)
        outputs = chat.gpt(False).generate(requests.prompts, requests.sampling, False, max_batch=len(TEXTS))
        codes = [o.token_ids for o in outputs]  # [T_b, 4]
        with torch.inference_mode():
            mel = chat.dvae(audio.pad_batch(codes, torch.device("cpu")))  # [B, 100, 2*T_max], the reference's batch
            # the modules on that batch: Chat.infer decodes each row as if alone instead (docs/fidelity.md)
            wavs = [w[: (2 * len(c) - 1) * 256] for w, c in zip(chat.vocos(mel).numpy(), codes, strict=True)]
        side.decoded.update(codes=[c.numpy() for c in codes], mel=mel.numpy(), wavs=wavs)
    return side.decoded


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_dvae_decode_close(request: pytest.FixtureRequest, size: str) -> None:
    side: Side = request.getfixturevalue(f"{size}_side")
    ours, ref = decoded(side), side.reference["decode"]
    assert ref["yielded"], f"{size}: the reference generated nothing"
    same = [np.array_equal(a, b) for a, b in zip(ours["codes"], ref["codes"], strict=True)]
    assert len(same) == len(ref["codes"]) and all(same), f"{size}: codes differ (see test_ref_code)"
    lengths = [len(c) for c in ours["codes"]]
    errors = {
        "mel": max_abs_error(ours["mel"], ref["mel_dvae"]),
        # ours cuts row b to (2*T_b - 1) * 256 samples; the reference keeps the padded batch width
        "wav": max(max_abs_error(w, ref["wav_dvae"][b, : len(w)]) for b, w in enumerate(ours["wavs"])),
        "wav_peak": float(np.abs(ref["wav_dvae"]).max()), "lengths": lengths,
    }
    record("dvae_decode", size, errors)
    assert errors["mel"] <= TOLERANCE and errors["wav"] <= TOLERANCE, f"{size}: {errors}"
    if size == "tiny":
        assert len(set(lengths)) == len(lengths), f"want rows of different lengths (padded batch), got {lengths}"
