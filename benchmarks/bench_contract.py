"""Targets 4 and 7 of bench_cpu.py: the seed contract in the fast modes and the int8 KV cache.

measure_seeds(chat, steps): a seeded text's codes and hidden states alone, among 8 and among 16 texts, through
`Chat.speech_requests` + `Chat.gpt(True).generate` (the same seed, other texts around it).
measure_kv_int8(model, dtype, plan): bench_kv_int8.py's A/B (decode steps at 32 x 300 positions, bf16 KV against
int8 KV, alternating turns) in this process, on the benchmark's threads.
"""
from __future__ import annotations

import argparse

import torch

TARGET = "The request we follow, word for word."
OTHERS = [f"Another sentence, number {i}, rather longer than the first one." for i in range(15)]


def measure_seeds(chat, steps: int) -> dict:
    from chattts_velocity import InferCodeParams
    from chattts_velocity.text import split_pieces

    params = InferCodeParams(manual_seed=7, max_new_token=steps, min_new_token=steps, show_tqdm=False)

    def target_output(texts: list[str]):
        requests = chat.speech_requests(split_pieces(texts, split=False), params)
        outputs = chat.gpt(True).generate(requests.prompts, requests.sampling, False, max_batch=len(texts))
        return outputs[texts.index(TARGET)]

    alone = target_output([TARGET])
    report = {}
    for n in (8, 16):
        batch = target_output(OTHERS[: n // 2] + [TARGET] + OTHERS[n // 2: n - 1])
        report[f"among_{n}"] = {"codes_equal": torch.equal(alone.token_ids, batch.token_ids),
                                "hidden_max_diff": (alone.hidden - batch.hidden).abs().max().item()}
    return report


def measure_kv_int8(model: str, dtype: str, plan: dict) -> dict:
    """{"seqs", "context", "dtype", "int8_speedup", ...}, or {"skipped": why} where the cpu backend cannot run."""
    from benchmarks.bench_kv_int8 import KV_DTYPES, _ab, _decode_turn, _engine
    from chattts_velocity.demo import ensure_model

    args = argparse.Namespace(model=str(ensure_model(model)[0]), dtype=dtype)
    seqs, context = plan["kv_seqs"], plan["kv_context"]
    try:
        turns = {kv: _decode_turn(_engine(args, kv), seqs, context) for kv in KV_DTYPES}
    except SystemExit as exc:  # e.g. head_dim 16 (tiny weights) or no AVX-512 BF16: int8 KV needs the cpu backend
        return {"seqs": seqs, "context": context, "dtype": dtype, "skipped": str(exc)}
    result = _ab(turns, plan["repeats"] * 3)
    return {"seqs": seqs, "context": context, "dtype": dtype, **result}
