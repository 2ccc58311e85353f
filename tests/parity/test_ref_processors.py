"""Parity: engine.logits_processors equal the reference's penalty class and HF TopP/TopK warpers (min keep 3)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from chattts_velocity.engine.worker.sampling.logits_processors import (
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
)

from .refclient import RefClient

pytestmark = pytest.mark.parity

WINDOW = 16  # the reference penalty's past_window


@dataclass(frozen=True)
class Case:
    """One reference call: rows share these scalar parameters (the reference has no per-row ones)."""

    name: str
    rows: int
    vocab: int
    temperature: float
    penalty: float | None
    top_p: float | None
    top_k: int | None
    history_len: int
    id_range: int = 12  # history ids drawn from [0, id_range): small ranges make repeats
    seed: int = 0

    def logits(self) -> np.ndarray:  # [R, V]
        rng = np.random.default_rng(self.seed)
        return (3.0 * rng.standard_normal((self.rows, self.vocab))).astype(np.float32)

    def history(self) -> np.ndarray:  # [R, G]
        rng = np.random.default_rng(self.seed + 1)
        return rng.integers(0, self.id_range, (self.rows, self.history_len)).astype(np.int64)


CASES = [
    Case("code_default", 8, 626, 0.3, 1.05, 0.7, 20, history_len=20),
    Case("code_top_k_1", 8, 626, 0.3, 1.05, 0.7, 1, history_len=5),
    Case("code_top_k_2", 4, 626, 1.0, None, None, 2, history_len=0),
    Case("code_strong_penalty", 8, 626, 1.0, 1.8, None, None, history_len=40, id_range=4),
    Case("code_tiny_top_p", 4, 626, 0.5, None, 0.01, None, history_len=0),
    Case("code_wide", 12, 626, 0.7, 1.2, 0.95, 100, history_len=16, id_range=30, seed=3),
    Case("text_default", 2, 21178, 0.7, None, 0.7, 20, history_len=0),
    Case("text_penalty", 2, 21178, 0.7, 1.3, 0.7, 20, history_len=10, id_range=5, seed=5),
]


def reference_task(case: Case) -> dict:
    return {"name": case.name, "kind": "processors", "logits": case.logits(), "history": case.history(),
            "temperature": case.temperature, "repetition_penalty": case.penalty, "top_P": case.top_p,
            "top_K": case.top_k, "num_code": case.vocab - 1 if case.vocab == 626 else case.vocab}


@pytest.fixture(scope="module")
def reference(ref_client: RefClient) -> dict[str, dict]:
    """All cases in one reference run (one interpreter start)."""
    return ref_client.run([reference_task(case) for case in CASES])


def windowed(history: np.ndarray, width: int = WINDOW) -> torch.Tensor:
    """Our history layout: the last `width` ids per row, left-padded with -1."""
    rows, length = history.shape
    out = torch.full((rows, width), -1, dtype=torch.long)
    keep = min(width, length)
    if keep:
        out[:, width - keep:] = torch.from_numpy(history[:, length - keep:])
    return out


def ours(case: Case, stage: str) -> torch.Tensor:
    """Our functions on the case's inputs, run up to `stage`."""
    rows = case.rows
    logits = apply_temperature(torch.from_numpy(case.logits()), torch.full((rows,), case.temperature))
    if stage == "after_temperature":
        return logits
    if case.penalty is not None:
        logits = apply_repetition_penalty(logits, windowed(case.history()), torch.full((rows,), case.penalty))
    if stage == "after_penalty":
        return logits
    if case.top_p is not None:
        logits = apply_top_p(logits, torch.full((rows,), case.top_p))
    if stage == "after_top_p":
        return logits
    if case.top_k is not None:
        logits = apply_top_k(logits, torch.full((rows,), case.top_k, dtype=torch.long))
    return logits


def assert_same_logits(actual: torch.Tensor, expected: np.ndarray, what: str) -> None:
    expected_t = torch.from_numpy(expected)
    masked = torch.isneginf(expected_t)
    assert torch.equal(torch.isneginf(actual), masked), f"{what}: different -inf masks"
    # bit-exact: near-greedy code parity downstream depends on identical processed logits
    torch.testing.assert_close(actual[~masked], expected_t[~masked], rtol=0.0, atol=0.0, msg=what)


@pytest.mark.parametrize("stage", ["after_temperature", "after_penalty", "after_top_p", "after_top_k"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_stage_matches_reference(reference: dict[str, dict], case: Case, stage: str) -> None:
    assert_same_logits(ours(case, stage), reference[case.name][stage], f"{case.name}/{stage}")


def test_small_top_k_keeps_three(reference: dict[str, dict]) -> None:
    for name in ("code_top_k_1", "code_top_k_2"):
        kept = np.isfinite(reference[name]["after_top_k"]).sum(axis=1)
        assert (kept >= 3).all(), f"{name}: reference kept {kept}"


def test_per_row_parameters_match_row_wise_reference(reference: dict[str, dict]) -> None:
    """Rows of different cases stacked into one batch with per-row parameters give each case's reference rows."""
    code_cases = [c for c in CASES if c.vocab == 626 and c.history_len > 0 and c.penalty is not None]
    logits = torch.cat([torch.from_numpy(c.logits()) for c in code_cases])
    history = torch.cat([windowed(c.history()) for c in code_cases])

    def per_row(field: str) -> torch.Tensor:  # [R]: each case's scalar repeated over its rows
        return torch.cat([torch.full((c.rows,), float(getattr(c, field))) for c in code_cases])

    logits = apply_temperature(logits, per_row("temperature"))
    logits = apply_repetition_penalty(logits, history, per_row("penalty"))
    top_p = torch.cat([torch.full((c.rows,), c.top_p if c.top_p is not None else 1.0) for c in code_cases])
    top_k = torch.cat([torch.full((c.rows,), c.top_k or 0, dtype=torch.long) for c in code_cases])
    logits = apply_top_k(apply_top_p(logits, top_p), top_k)
    expected = np.concatenate([reference[c.name]["after_top_k"] for c in code_cases])
    assert_same_logits(logits, expected, "stacked per-row batch")
