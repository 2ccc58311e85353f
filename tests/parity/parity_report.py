"""Parity stage, bookkeeping: measured errors of our plain path vs the reference -> test-artifacts/parity.json.

In: (section, case, {quantity: value}) from the parity tests. Out: the merged JSON file and one printed line each.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
REPORT_ENV = "CHATTTS_PARITY_REPORT"  # overrides the artifact path


def report_path() -> Path:
    return Path(os.environ.get(REPORT_ENV) or REPO / "test-artifacts" / "parity.json")


def max_abs_error(ours: Any, reference: Any) -> float:
    """max |ours - reference| over equal-shaped arrays (a shape mismatch is an error, not a number)."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {a.shape} != reference shape {b.shape}")
    return float(np.abs(a - b).max()) if a.size else 0.0


def record(section: str, case: str, values: dict[str, Any]) -> None:
    """Merge values into report[section][case] (other entries are kept) and print them."""
    path = report_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        report = {}
    report.setdefault(section, {}).setdefault(case, {}).update(values)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    shown = ", ".join(f"{k}={v:.3e}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    print(f"[parity] {section}/{case}: {shown}")


def decisive_min_gap(top2_gap: np.ndarray, lengths: list[int]) -> float:
    """Smallest reference top-2 logit gap over the steps that decided each row's output.

    top2_gap: [S, B] or [S, B, 4]. Row b's tokens came from steps 0..len_b-1, and step len_b (when it ran)
    decided its end; later steps of a finished row are discarded, so their near-ties do not matter.
    """
    steps = top2_gap.shape[0]
    gaps = [top2_gap[: min(n + 1, steps), b] for b, n in enumerate(lengths)]
    return float(min(g.min() for g in gaps if g.size)) if any(g.size for g in gaps) else float("inf")


def first_mismatch(ours: np.ndarray, reference: np.ndarray, top2_gap: np.ndarray, top1: np.ndarray,
                   row: int) -> str | None:
    """None when the id sequences are equal, else where they first differ and the reference's gap there."""
    if ours.shape == reference.shape and np.array_equal(ours, reference):
        return None
    common = min(len(ours), len(reference))
    differs = [s for s in range(common) if not np.array_equal(ours[s], reference[s])]
    step = differs[0] if differs else common  # equal prefixes: one side stopped (EOS) earlier
    mine = ours[step].tolist() if step < len(ours) else "end"
    theirs = reference[step].tolist() if step < len(reference) else "end"
    where = (f"gap {top2_gap[step, row].tolist()}, argmax {top1[step, row].tolist()}"
             if step < top2_gap.shape[0] else "no reference step recorded")
    return (f"row {row}: lengths {len(ours)} vs {len(reference)}, first mismatch at step {step}: "
            f"ours {mine}, reference {theirs}; reference top-2 {where}")
