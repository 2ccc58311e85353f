"""The audio decode's precision on this CPU: `Chat.infer` with the Decoder + Vocos in bf16 against float32, same
GPT (int8), same texts and seed, interleaved rounds in one process. What precision.py's CPU default rests on (bf16
only where the CPU computes it natively: docs/performance.md).

    python -m benchmarks.bench_audio_dtype --model .pytest-assets/full --texts 3,8 --name spr-amx
    CHATTTS_VELOCITY_CPU_KERNELS=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python -m benchmarks.bench_audio_dtype --model .pytest-assets/full --texts 3 --name x86-avx2-emulated
    python -m benchmarks.bench_audio_dtype --parts 1,64 --profile-texts 64 --name zen4-avx512bf16
    CHATTTS_VELOCITY_CPU_KERNELS=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python -m benchmarks.bench_audio_dtype --model random --parts 1,8 --threads 1 --name zen4-avx512bf16-as-avx2

--parts: Decoder + Vocos alone (the bf16 C++ path against autocast's module path and float32, and its waveform's SNR
against float32) at those row counts, and with --profile-texts Chat.infer's stage shares before and after
(benchmarks/audio_parts.py); written to audio_parts_<name>.json. --model random: full-size random audio weights made
in the process (no asset folder).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.lib.ab import by_name, interleaved

REPO = Path(__file__).resolve().parents[1]

DTYPES = ("bfloat16", "float32")


def main(argv: list[str] | None = None) -> dict:
    from chattts_velocity import Chat
    from chattts_velocity.model import kernels
    from chattts_velocity.params import InferCodeParams

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / ".pytest-assets" / "full"))
    parser.add_argument("--texts", default="3,8", help="comma-separated numbers of texts per infer call")
    parser.add_argument("--steps", type=int, default=150, help="forced code steps per text")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="host")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--parts", default="", help="row counts for the audio-stage A/B (skips the dtype A/B)")
    parser.add_argument("--part-steps", type=int, default=64, help="GPT steps per row (2x mel frames)")
    parser.add_argument("--profile-texts", type=int, default=0, help="with --parts: Chat.infer's stage shares")
    parser.add_argument("--note", default="", help="kept in the report, e.g. 'shared host, load 8-16 on 2 vCPUs'")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.parts:
        return parts(args)
    chats = {}
    for dtype in DTYPES:
        chats[dtype] = Chat()
        chats[dtype].load(source="custom", custom_path=args.model, verify=False, use_vllm=True, dtype="int8",
                          decode_dtype=dtype)
    params = InferCodeParams(manual_seed=1, max_new_token=args.steps, min_new_token=args.steps, show_tqdm=False)
    seconds: dict[str, dict[str, list[float]]] = {}
    for count in (int(n) for n in args.texts.split(",")):
        texts = [f"Sentence number {i}, spoken by the same voice at a steady pace." for i in range(count)]

        def measure(dtype: str, texts: list[str] = texts) -> float:
            start = time.perf_counter()
            chats[dtype].infer(texts, skip_refine_text=True, params_infer_code=params)
            return time.perf_counter() - start

        seconds[str(count)] = by_name(list(chats), interleaved(list(chats), args.rounds, measure))
    report = {"kernels": kernels.kernel_path(), "native_bf16": kernels.native_bf16(), "steps": args.steps,
              "seconds": seconds,
              "bf16_over_float32": {n: min(s["bfloat16"]) / min(s["float32"]) for n, s in seconds.items()}}
    out = Path(args.out) / f"audio_dtype_{args.name}.json"
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps(report, indent=1))
    return report


def parts(args: argparse.Namespace) -> dict:
    from benchmarks.audio_parts import decode_parts, infer_shares
    from benchmarks.lib.probe import cpu_identity
    from benchmarks.lib.public import load_chat

    report: dict = {"host": cpu_identity(), "note": args.note, "threads": args.threads,
                    "decode": decode_parts(args.model, [int(n) for n in args.parts.split(",")], args.part_steps,
                                           args.rounds)}
    if args.profile_texts:
        chat = load_chat(args.model, "int8", args.threads)
        report["infer"] = infer_shares(chat, args.profile_texts, args.part_steps)
    out = Path(args.out) / f"audio_parts_{args.name}.json"
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
