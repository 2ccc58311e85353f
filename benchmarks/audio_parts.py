"""The audio stage alone and its share of Chat.infer: bf16 on its C++ path (audio/cpu_decode.py: oneDNN bf16 where
the CPU computes bf16, else audio/cpu_panels.py's 16-bit weights; "bf16_path" in the report) against autocast's
module path and float32, interleaved in one process, process CPU time, and the waveform's SNR against float32
(bench_audio_dtype.py --parts)."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from benchmarks.lib.ab import by_name, interleaved

VARIANTS = ("bf16_channels_last", "bf16_autocast", "float32")


@contextmanager
def autocast_path(on: bool) -> Iterator[None]:
    """With on: bf16 decodes take autocast's module path (the path before channels-last)."""
    from chattts_velocity.audio import cpu_decode

    original = cpu_decode.available
    if on:
        cpu_decode.available = lambda: False  # type: ignore[assignment]
    try:
        yield
    finally:
        cpu_decode.available = original  # type: ignore[assignment]


def _timed(run: Callable[[], Any]) -> tuple[float, float]:
    """(process CPU seconds, wall seconds) of run()."""
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - cpu, time.perf_counter() - wall


def snr_db(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    """The waveforms' signal-to-noise ratio against the reference, all rows together, in dB."""
    ref, got = np.concatenate(reference).astype(np.float64), np.concatenate(other).astype(np.float64)
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))


def random_full_audio() -> tuple[Any, Any]:
    """A Decoder and Vocos of the real sizes with the demo's well-scaled random weights (chattts_velocity/demo)."""
    from chattts_velocity.audio import Decoder, Vocos
    from chattts_velocity.demo.random_weights import FULL_DIMS, asset_shapes, build_file

    shapes = asset_shapes(FULL_DIMS)
    made = [build_file(f"asset/{name}.safetensors", shapes[f"asset/{name}.safetensors"], 1, FULL_DIMS, lambda n: None)
            for name in ("Decoder", "Vocos")]
    return Decoder.from_state_dict(made[0]).eval(), Vocos.from_state_dict(made[1]).eval()


def decode_parts(model: str, counts: list[int], steps: int, rounds: int) -> dict:
    """Decoder + Vocos of `count` rows of `steps` GPT steps (2 * steps mel frames) per variant, min over rounds."""
    from chattts_velocity.assets import AssetPaths
    from chattts_velocity.audio import (
        Decoder,
        Vocos,
        cast_for_autocast,
        cpu_decode,
        decode_hidden_batch,
        load_safetensors,
    )

    if model == "random":  # full-size random audio weights made here (no 1 GB asset folder)
        decoder, vocos = random_full_audio()
    else:
        paths = AssetPaths.from_root(model)
        decoder = Decoder.from_state_dict(load_safetensors(paths.decoder))
        vocos = Vocos.from_state_dict(load_safetensors(paths.vocos))
    cast = cast_for_autocast(decoder, torch.bfloat16), cast_for_autocast(vocos, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"steps": steps, "mel_frames": 2 * steps, "clock": "process CPU time (min of rounds)",
                           "bf16_path": cpu_decode.path()}
    for count in counts:
        rows = [torch.randn(steps, 2 * decoder.decoder.idim, generator=g) for _ in range(count)]
        wavs: dict[str, list[np.ndarray]] = {}

        def measure(variant: str, rows: list[torch.Tensor] = rows,
                    wavs: dict[str, list[np.ndarray]] = wavs) -> tuple[float, float]:
            modules, dtype = (cast, torch.bfloat16) if variant != "float32" else ((decoder, vocos), None)
            with autocast_path(variant == "bf16_autocast"):
                return _timed(lambda: wavs.__setitem__(variant, decode_hidden_batch(*modules, rows, dtype)))

        # a warm-up round first (packing, oneDNN's kernels)
        seen = by_name(VARIANTS, interleaved(VARIANTS, rounds, measure, warm_up=True))
        best = {v: min(c for c, _ in t) for v, t in seen.items()}
        out[str(count)] = {"cpu_s": best, "wall_s": {v: min(w for _, w in t) for v, t in seen.items()},
                           "speedup_vs_autocast": best["bf16_autocast"] / best["bf16_channels_last"],
                           "speedup_vs_float32": best["float32"] / best["bf16_channels_last"],
                           "snr_db_vs_float32": snr_db(wavs["float32"], wavs["bf16_channels_last"]),
                           "gflop_per_cpu_s": {v: 150e-3 * steps * count / s for v, s in best.items()}}
    return out


def infer_shares(chat: Any, texts: int, steps: int) -> dict:
    """profile_infer's stage shares of Chat.infer at `texts` texts, the audio path before and after, its stage
    clock on process CPU time (a shared host's wall clock mostly measures the other tenants)."""
    from benchmarks.lib import public

    public.profile_infer(chat, 1, 4)  # warm-up
    out = {}
    real_time = public.time
    public.time = SimpleNamespace(perf_counter=time.process_time)  # type: ignore[assignment]
    try:
        for name, old in (("before", True), ("after", False)):
            with autocast_path(old):
                out[name] = public.profile_infer(chat, texts, steps)
    finally:
        public.time = real_time
    return out


def parts_table(report: dict) -> str:
    """Markdown: Decoder + Vocos process CPU seconds per variant and row count, the bf16 path's speed-ups and its
    waveform's SNR against float32 (render_docs.py)."""
    decode = report["decode"]
    path = {"onednn": "oneDNN bf16", "panels": "bf16 weights, fp32 arithmetic"}.get(decode.get("bf16_path", "onednn"))
    lines = [f"| rows of {decode['mel_frames']} mel frames | bf16 C++ path ({path}) | bf16 autocast (before) | float32 "
             "| vs autocast | vs float32 | SNR vs float32 | bf16 C++ path GFLOP per CPU-s |",
             "|---|---|---|---|---|---|---|---|"]
    for count, row in ((k, v) for k, v in decode.items() if isinstance(v, dict)):
        cpu = row["cpu_s"]
        snr = f"{row['snr_db_vs_float32']:.1f} dB" if "snr_db_vs_float32" in row else "not measured"
        lines.append(f"| {count} | {cpu['bf16_channels_last']:.3f} s | {cpu['bf16_autocast']:.3f} s | "
                     f"{cpu['float32']:.3f} s | {row['speedup_vs_autocast']:.2f}x | "
                     f"{cpu['float32'] / cpu['bf16_channels_last']:.2f}x | {snr} | "
                     f"{row['gflop_per_cpu_s']['bf16_channels_last']:.0f} |")
    return "\n".join(lines) + "\n"


def shares_table(report: dict) -> str:
    """Markdown: Chat.infer's stage shares before and after (render_docs.py)."""
    infer = report.get("infer")
    if not infer:
        return "Not measured in this file (no --profile-texts).\n"
    stages = list(infer["after"]["share"])
    lines = [f"| {infer['after']['concurrency']} texts x {infer['after']['steps']} steps | CPU s | "
             + " | ".join(stages) + " | not GPT |", "|---|---|" + "---|" * (len(stages) + 1)]
    for name in ("before", "after"):
        run = infer[name]
        lines.append(f"| {name} | {run['wall_s']:.2f} | " + " | ".join(f"{100 * run['share'][s]:.1f} %" for s in stages)
                     + f" | {100 * run['non_gpt_share']:.1f} % |")
    return "\n".join(lines) + "\n"
