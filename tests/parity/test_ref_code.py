"""Parity, code phase: our plain path (prompts -> PlainGPT -> Decoder -> Vocos) vs chattts 0.2.5.

Both sides load the same random-weight checkpoint (tiny and full size) and generate one left-padded batch of
mixed-length texts. Code ids must be identical; hidden states, mel and waveform within 1e-4 (errors are written
to test-artifacts/parity.json).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from chattts_velocity import audio, text
from chattts_velocity.chat import Chat
from chattts_velocity.schema import GenerationOutput, pad_left

from .parity_report import decisive_min_gap, first_mismatch, max_abs_error, record
from .refclient import RefClient

pytestmark = pytest.mark.parity

TOLERANCE = 1e-4  # max abs error on hidden states, mel and waveform
MIN_GAP = 1e-3  # near-greedy cases must not hinge on a closer top-2 logit tie (raw-logit units)
NEAR_GREEDY = 1e-6  # temperature: sampling is an argmax unless two logits tie within float precision
TEXTS = ("你好。", "hello world, this is a parity test.", "今天天气很好[uv_break]我们去公园散步吧，好不好？")


def speaker_string(dim: int, seed: int) -> str:
    """An explicit speaker string (not a torch seed: fp16 randn differs between torch 2.11 and 2.13)."""
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float16)  # [dim]
    return text.encode_spk_emb(torch.from_numpy(vector))


def audio_prompt(frames: int, seed: int) -> str:
    """An spk_smp string holding random codes [4, frames] (audio EOS 625 excluded)."""
    codes = np.random.default_rng(seed).integers(0, 625, (4, frames)).astype(np.int32)
    return text.encode_prompt(torch.from_numpy(codes))


def forced(steps: int, **extra: Any) -> dict[str, Any]:
    """Near-greedy params whose EOS is masked until max_new_token: every row has exactly `steps` tokens."""
    return {"temperature": NEAR_GREEDY, "min_new_token": steps, "max_new_token": steps, **extra}


@dataclass(frozen=True)
class CodeCase:
    name: str
    size: str  # "tiny" | "full"
    params: dict[str, Any]  # InferCodeParams fields, the same on both sides
    torch_seed: int | None = None  # global RNG seed right before generating
    greedy: bool = True  # near-greedy: the top-2 gap check applies
    texts: tuple[str, ...] = field(default=TEXTS)

    @property
    def id(self) -> str:
        return f"{self.size}-{self.name}"


TXT_SMP = "这是样本的文字。"
CASES = [
    CodeCase("plain", "tiny", forced(12)),
    CodeCase("speaker", "tiny", forced(12, spk_emb=speaker_string(64, 1))),
    CodeCase("audio_prompt", "tiny", forced(12, spk_smp=audio_prompt(20, 6), txt_smp=TXT_SMP)),
    CodeCase("eos", "tiny", {"temperature": NEAR_GREEDY, "max_new_token": 200, "spk_emb": speaker_string(64, 4)}),
    CodeCase("per_codebook_temperature", "tiny", forced(10, temperature=[NEAR_GREEDY, 1e-5, NEAR_GREEDY, 1e-5])),
    CodeCase("manual_seed", "tiny", {"temperature": 0.3, "max_new_token": 60, "manual_seed": 7}, greedy=False),
    CodeCase("global_seed", "tiny", {"temperature": 0.3, "max_new_token": 16, "min_new_token": 16},
             torch_seed=123, greedy=False),
    CodeCase("speaker", "full", forced(8, spk_emb=speaker_string(768, 4))),
    CodeCase("audio_prompt", "full", forced(8, spk_emb=speaker_string(768, 5), spk_smp=audio_prompt(16, 6),
                                            txt_smp=TXT_SMP)),
    CodeCase("manual_seed", "full", {"temperature": 0.3, "min_new_token": 8, "max_new_token": 8,
                                     "manual_seed": 11}, greedy=False),
]


@dataclass
class Ours:
    prompt_ids: torch.Tensor  # [B, L, 4] left-padded
    prompt_mask: torch.Tensor  # [B, L]
    outputs: list[GenerationOutput]
    mel: np.ndarray  # [B, 100, 2*T_max]
    wavs: list[np.ndarray]  # row b: (2*T_b - 1) * 256 samples


@dataclass
class Side:
    """One checkpoint size: our Chat, the reference results of its cases, and our results (computed on demand)."""

    chat: Chat
    reference: dict[str, dict[str, Any]]
    ours: dict[str, Ours] = field(default_factory=dict)

    def run(self, case: CodeCase) -> Ours:
        if case.name not in self.ours:
            self.ours[case.name] = run_ours(self.chat, case)
        return self.ours[case.name]


def run_ours(chat: Chat, case: CodeCase) -> Ours:
    params = Chat.InferCodeParams(show_tqdm=False, **case.params)
    spk_smp = text.decode_prompt(params.spk_smp) if params.spk_smp else None
    prompts = [chat.tokenizer.code_prompt(t, params.spk_emb, params.txt_smp, params.prompt, spk_smp)
               for t in case.texts]
    ids, mask, _ = pad_left(prompts)
    if case.torch_seed is not None:
        torch.manual_seed(case.torch_seed)
    # one batch for all texts, as the reference: the same left padding
    requests = chat.speech_requests(text.split_pieces(list(case.texts), split=False), params)
    outputs = chat.gpt(False).generate(requests.prompts, requests.sampling, False, max_batch=len(case.texts))
    hiddens = [o.hidden for o in outputs]
    with torch.inference_mode():
        mel = chat.decoder(audio.pad_batch(hiddens, torch.device("cpu")))  # the reference's zero-padded batch
        # the modules on that batch: Chat.infer decodes each row as if alone instead (docs/fidelity.md)
        wavs = [w[: (2 * h.shape[0] - 1) * 256] for w, h in zip(chat.vocos(mel).numpy(), hiddens, strict=True)]
    return Ours(ids, mask, outputs, mel.numpy(), wavs)


def make_side(ref_client: RefClient, assets: Path, size: str) -> Side:
    """All reference runs of one size in one runner call (interpreter start and model load dominate)."""
    tasks = [{"name": c.name, "kind": "infer_code", "texts": list(c.texts), "params": c.params,
              "torch_seed": c.torch_seed, "decode": ["decoder"]} for c in CASES if c.size == size]
    reference = ref_client.run(tasks, asset_root=assets, size=size)
    chat = Chat()
    chat.load(source="custom", custom_path=assets, verify=False)
    return Side(chat, reference)


@pytest.fixture(scope="module")
def tiny_side(ref_client: RefClient, tiny_assets: Path) -> Side:
    return make_side(ref_client, tiny_assets, "tiny")


@pytest.fixture(scope="module")
def full_side(ref_client: RefClient, full_assets: Path) -> Side:
    return make_side(ref_client, full_assets, "full")


def results(request: pytest.FixtureRequest, case: CodeCase) -> tuple[Ours, dict[str, Any]]:
    side: Side = request.getfixturevalue(f"{case.size}_side")
    reference = side.reference[case.name]
    assert reference["yielded"], f"{case.id}: the reference generated nothing (EOS at step 0 of a seeded run)"
    return side.run(case), reference


def lengths(ours: Ours) -> list[int]:
    return [len(o.token_ids) for o in ours.outputs]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_prompt_batch_matches_reference(request: pytest.FixtureRequest, case: CodeCase) -> None:
    ours, ref = results(request, case)
    assert np.array_equal(ours.prompt_ids.numpy(), ref["prompt_ids"]), f"{case.id}: prompt ids differ"
    assert np.array_equal(ours.prompt_mask.numpy(), ref["prompt_mask"].astype(np.int64)), f"{case.id}: masks differ"
    assert len(set(ours.prompt_mask.sum(1).tolist())) > 1, f"{case.id}: texts must differ in length (left padding)"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_code_ids_identical(request: pytest.FixtureRequest, case: CodeCase) -> None:
    ours, ref = results(request, case)
    gap = decisive_min_gap(ref["top2_gap"], [len(c) for c in ref["codes"]])
    record("code", case.id, {"ids_identical": all(
        np.array_equal(o.token_ids.numpy(), c) for o, c in zip(ours.outputs, ref["codes"], strict=True)),
        "min_top2_gap": gap, "lengths": lengths(ours)})
    problems = [first_mismatch(o.token_ids.numpy(), codes, ref["top2_gap"], ref["top1"], b)
                for b, (o, codes) in enumerate(zip(ours.outputs, ref["codes"], strict=True))]
    problems = [p for p in problems if p]
    assert len(ours.outputs) == len(ref["codes"]) and not problems, f"{case.id}: " + "; ".join(problems)


@pytest.mark.parametrize("case", [c for c in CASES if c.greedy], ids=[c.id for c in CASES if c.greedy])
def test_near_greedy_case_has_no_near_tie(request: pytest.FixtureRequest, case: CodeCase) -> None:
    """Identical ids only prove something when no decisive step was a coin toss between two logits."""
    _, ref = results(request, case)
    gap = decisive_min_gap(ref["top2_gap"], [len(c) for c in ref["codes"]])
    assert gap >= MIN_GAP, f"{case.id}: reference top-2 gap {gap:.2e} < {MIN_GAP}; pick other texts/speakers"


def test_eos_case_ends_by_eos_with_mixed_lengths(request: pytest.FixtureRequest) -> None:
    case = next(c for c in CASES if c.id == "tiny-eos")
    ours, _ = results(request, case)
    assert all(o.finish_reason == "eos" for o in ours.outputs), [o.finish_reason for o in ours.outputs]
    assert len(set(lengths(ours))) == len(ours.outputs), f"want distinct lengths (padded decode), got {lengths(ours)}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hidden_mel_wav_close(request: pytest.FixtureRequest, case: CodeCase) -> None:
    ours, ref = results(request, case)
    if [len(o.token_ids) for o in ours.outputs] != [len(c) for c in ref["codes"]]:
        pytest.fail(f"{case.id}: different lengths; see test_code_ids_identical")
    errors = {
        "hidden": max(max_abs_error(o.hidden, h) for o, h in zip(ours.outputs, ref["hidden"], strict=True)),
        "mel": max_abs_error(ours.mel, ref["mel_decoder"]),
        # ours cuts row b to (2*T_b - 1) * 256 samples; the reference keeps the padded batch width
        "wav": max(max_abs_error(w, ref["wav_decoder"][b, : len(w)]) for b, w in enumerate(ours.wavs)),
        "wav_peak": float(np.abs(ref["wav_decoder"]).max()),
    }
    record("code", case.id, errors)
    bad = {k: v for k, v in errors.items() if k != "wav_peak" and v > TOLERANCE}
    assert not bad, f"{case.id}: max abs errors above {TOLERANCE}: {bad}"
