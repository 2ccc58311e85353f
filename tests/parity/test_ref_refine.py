"""Parity, refine-text phase: our plain path (refine prompts -> PlainGPT text mode -> refined text) vs chattts 0.2.5.

Same random-weight checkpoint on both sides, one left-padded batch of mixed-length texts; the generated ids
(break tokens included, EOS excluded), the [break_0] filter and the decoded text must be identical.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from chattts_velocity.chat import Chat
from chattts_velocity.schema import GenerationOutput, pad_left

from .parity_report import decisive_min_gap, first_mismatch, record
from .refclient import RefClient

pytestmark = pytest.mark.parity

MIN_GAP = 1e-3  # near-greedy cases must not hinge on a closer top-2 logit tie (raw-logit units)
NEAR_GREEDY = 1e-6
TEXTS = ("你好。", "hello world, this is a parity test.", "今天天气很好，我们去公园散步吧，好不好？")
ORAL = "[oral_2][laugh_0][break_6]"


@dataclass(frozen=True)
class RefineCase:
    name: str
    size: str  # "tiny" | "full"
    params: dict[str, Any]  # RefineTextParams fields, the same on both sides
    greedy: bool = True
    texts: tuple[str, ...] = field(default=TEXTS)

    @property
    def id(self) -> str:
        return f"{self.size}-{self.name}"


CASES = [
    RefineCase("default_prompt", "tiny", {"temperature": NEAR_GREEDY}),
    RefineCase("oral_prompt", "tiny", {"temperature": NEAR_GREEDY, "prompt": ORAL}),
    RefineCase("manual_seed", "tiny", {"prompt": ORAL, "manual_seed": 5}, greedy=False),  # default top-P/K, 0.7
    RefineCase("oral_prompt", "full", {"temperature": NEAR_GREEDY, "prompt": ORAL, "max_new_token": 48}),
]


@dataclass
class Ours:
    prompt_ids: torch.Tensor  # [B, L, 4] left-padded
    prompt_mask: torch.Tensor  # [B, L]
    outputs: list[GenerationOutput]  # token_ids [T_b, 1]
    texts: list[str]  # Chat._refine: what the code phase would read
    break_0: int  # ids from [break_0] on are dropped from the refined text


@dataclass
class Side:
    chat: Chat
    reference: dict[str, dict[str, Any]]
    ours: dict[str, Ours] = field(default_factory=dict)

    def run(self, case: RefineCase) -> Ours:
        if case.name not in self.ours:
            self.ours[case.name] = run_ours(self.chat, case)
        return self.ours[case.name]


def run_ours(chat: Chat, case: RefineCase) -> Ours:
    params = Chat.RefineTextParams(show_tqdm=False, **case.params)
    prompts = [chat.tokenizer.refine_prompt(t, params.prompt) for t in case.texts]
    ids, mask, _ = pad_left(prompts)
    sampling = params.to_sampling_params("text", chat.tokenizer.eos_id, return_hidden=False)
    outputs = chat.gpt(False).generate(prompts, sampling)  # one batch for all texts, as the reference
    refined = [chat.tokenizer.refined_text(o.token_ids[:, 0].tolist()) for o in outputs]
    return Ours(ids, mask, outputs, refined, chat.tokenizer.break_0_id)


def make_side(ref_client: RefClient, assets: Path, size: str) -> Side:
    tasks = [{"name": c.name, "kind": "refine_text", "texts": list(c.texts), "params": c.params}
             for c in CASES if c.size == size]
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


def results(request: pytest.FixtureRequest, case: RefineCase) -> tuple[Ours, dict[str, Any]]:
    side: Side = request.getfixturevalue(f"{case.size}_side")
    reference = side.reference[case.name]
    assert reference["yielded"], f"{case.id}: the reference generated nothing (EOS at step 0 of a seeded run)"
    return side.run(case), reference


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_prompt_batch_matches_reference(request: pytest.FixtureRequest, case: RefineCase) -> None:
    ours, ref = results(request, case)
    assert np.array_equal(ours.prompt_ids.numpy(), ref["prompt_ids"]), f"{case.id}: prompt ids differ"
    assert np.array_equal(ours.prompt_mask.numpy(), ref["prompt_mask"].astype(np.int64)), f"{case.id}: masks differ"
    assert len(set(ours.prompt_mask.sum(1).tolist())) > 1, f"{case.id}: texts must differ in length (left padding)"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refined_ids_identical(request: pytest.FixtureRequest, case: RefineCase) -> None:
    ours, ref = results(request, case)
    mine = [o.token_ids[:, 0].numpy() for o in ours.outputs]
    record("refine", case.id, {
        "ids_identical": all(np.array_equal(a, b) for a, b in zip(mine, ref["ids"], strict=True)),
        "min_top2_gap": decisive_min_gap(ref["top2_gap"], [len(i) for i in ref["ids"]]),
        "lengths": [len(a) for a in mine], "finish": [o.finish_reason for o in ours.outputs]})
    problems = [first_mismatch(a, b, ref["top2_gap"], ref["top1"], row)
                for row, (a, b) in enumerate(zip(mine, ref["ids"], strict=True))]
    problems = [p for p in problems if p]
    assert len(mine) == len(ref["ids"]) and not problems, f"{case.id}: " + "; ".join(problems)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refined_text_identical(request: pytest.FixtureRequest, case: RefineCase) -> None:
    """Chat._refine's strings (break tokens filtered, ids decoded) equal the reference's decoded text."""
    ours, ref = results(request, case)
    assert ours.texts == [str(t) for t in ref["text"]]
    kept = [o.token_ids[:, 0].numpy() for o in ours.outputs]
    kept = [ids[ids < ours.break_0] for ids in kept]
    assert all(np.array_equal(a, b) for a, b in zip(kept, ref["filtered"], strict=True)), \
        f"{case.id}: filtered ids differ"


@pytest.mark.parametrize("case", [c for c in CASES if c.greedy], ids=[c.id for c in CASES if c.greedy])
def test_near_greedy_case_has_no_near_tie(request: pytest.FixtureRequest, case: RefineCase) -> None:
    _, ref = results(request, case)
    gap = decisive_min_gap(ref["top2_gap"], [len(i) for i in ref["ids"]])
    assert gap >= MIN_GAP, f"{case.id}: reference top-2 gap {gap:.2e} < {MIN_GAP}; pick other texts"


def test_tiny_cases_end_by_eos_with_mixed_lengths(request: pytest.FixtureRequest) -> None:
    """The EOS decision ([Ebreak]) is part of what is compared: the tiny cases must stop on their own."""
    for case in (c for c in CASES if c.size == "tiny"):
        ours, _ = results(request, case)
        reasons = [o.finish_reason for o in ours.outputs]
        assert reasons == ["eos"] * len(reasons), f"{case.id}: {reasons}"
        assert len({len(o.token_ids) for o in ours.outputs}) > 1, f"{case.id}: want mixed lengths"
