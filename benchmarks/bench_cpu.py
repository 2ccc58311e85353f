"""One command for every per-host performance target on this CPU, through the public API; one JSON per host kind.

    python -m benchmarks.bench_cpu --model .pytest-assets/full     # ~11 min; run it ALONE
    python -m benchmarks.bench_cpu --model .pytest-assets/tiny --quick --no-llamacpp   # smoke run, seconds
    python -m benchmarks.bench_cpu --model .pytest-assets/full --isa avx2   # an AVX2-only host, emulated

Writes results/cpu_<hostkind>.json (hostkind from the CPU family and its best matmul ISA, e.g. zen4-avx512bf16,
spr-amx, zen3-avx2; with --isa avx2 on a bigger CPU, <hostkind>-as-avx2: our AVX2 kernels, and torch / oneDNN held
to AVX2 by ONEDNN_MAX_CPU_ISA and ATEN_CPU_CAPABILITY, with this host's memory and cores): the CPU model and
flags, the kernel path in use, the host's own ceilings (streaming read GB/s and bf16 GEMM GFLOP/s on the
benchmark's threads), the weight bytes a decode step reads per precision, the raw measurements (bf16, int8, int4;
each with "stages": Chat.infer end to end at 1 and 64 texts split into GPT prefill, GPT decode, planning,
Decoder, Vocos and the Python around them: lib/public.py's profile_infer), the audio decode's dtype per precision
and its bf16 path ("audio": oneDNN bf16 or bf16 weights in fp32 arithmetic, audio/cpu_decode.path()) and every
target as {"target", "measured", "met"}.
llama.cpp's ratios need the `bench` extra (bench_llamacpp.py); without it their targets are recorded as skipped
with the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FULL = {"steps": 128, "batch_steps": 64, "stream_steps": 96, "sizes": [1, 16, 32, 64], "repeats": 2,
        "seed_steps": 48, "kv_seqs": 32, "kv_context": 300, "gemm_size": 2048, "read_mb": 400,
        "profile_sizes": [1, 64], "profile_steps": 64}
QUICK = {"steps": 8, "batch_steps": 8, "stream_steps": 48, "sizes": [1, 4], "repeats": 1,
         "seed_steps": 8, "kv_seqs": 4, "kv_context": 40, "gemm_size": 256, "read_mb": 32,
         "profile_sizes": [1, 4], "profile_steps": 8}
STREAM_SETTINGS = {  # label -> StreamOptions fields; "default" is whatever StreamOptions() is today
    "default": {},
    "first 4, lookahead 12": {"first_chunk_steps": 4, "first_lookahead_steps": 12},
    "first 8, lookahead 16": {"first_chunk_steps": 8, "first_lookahead_steps": 16},
    "first 4, lookahead 24": {"first_chunk_steps": 4, "first_lookahead_steps": 24},  # 28 steps, exact-level error
}


def weight_bytes_per_step(config) -> dict:
    """Bytes one decode step reads at batch 1: the 20 layers' linears in the engine's precision plus the four
    code heads, which stay float32 (the per-column int8 scales are < 0.1 % and left out; int4's are counted)."""
    h, i = config.hidden_size, config.intermediate_size
    linear = config.num_hidden_layers * (4 * h * h + 3 * h * i)
    heads = config.num_vq * config.num_audio_tokens * h
    return {"linear_params": linear, "head_params": heads, "float32": 4 * (linear + heads),
            "bfloat16": 2 * linear + 4 * heads, "int8": linear + 4 * heads,
            "int4": linear * 5 // 8 + 4 * heads}  # 4 bits and a 4-byte scale per 32 weights


def probes(threads: int, plan: dict) -> dict:
    """The host's ceilings; a quick plan probes small sizes (a 2048^3 bf16 GEMM takes minutes without AVX-512 BF16)."""
    from benchmarks.lib import probe

    return {"read_gbps": probe.read_gbps(threads, plan["read_mb"]),
            "bf16_gemm_gflops": probe.bf16_gemm_gflops(threads, plan["gemm_size"]),
            "contention": probe.contention_probe(threads), "threads": threads}


DTYPES = ("bfloat16", "int8", "int4")
AVX2_ONLY = {"CHATTTS_VELOCITY_CPU_KERNELS": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def measure_dtype(chat, plan: dict) -> dict:
    """One precision: one stream (prefill excluded) and 32 / 64 concurrent end to end, best of the repeats, and
    Chat.infer's time per stage (public.profile_infer) at the profile sizes, from the repeat with the shortest wall."""
    from benchmarks.lib.public import batch_run, decode_rate, profile_infer

    decode_rate(chat, 1, 4)  # warm-up
    one = max(decode_rate(chat, 1, plan["steps"]) for _ in range(plan["repeats"]))
    batches = {}
    for n in (32, 64):
        runs = [batch_run(chat, n, plan["batch_steps"]) for _ in range(plan["repeats"])]
        batches[str(n)] = max(runs, key=lambda r: r.steps_per_s_e2e).as_dict()  # str: as JSON reads it back
    stages = {str(n): min((profile_infer(chat, n, plan["profile_steps"]) for _ in range(plan["repeats"])),
                          key=lambda r: r["wall_s"]) for n in plan["profile_sizes"]}
    return {"one_stream_steps_per_s": one, "batch": batches, "stages": stages}


def measure_streams(chat, plan: dict) -> dict:
    """Time to first audio alone and among 16 for each stream setting, and its first chunk's error."""
    from benchmarks.lib.public import first_chunk_error, one_clip, stream_ttfa
    from chattts_velocity.speech import StreamOptions

    out, hidden = {}, one_clip(chat, plan["stream_steps"])
    for label, fields in STREAM_SETTINGS.items():
        options = StreamOptions(**fields)
        runs = {n: min((stream_ttfa(chat, n, plan["stream_steps"], options) for _ in range(plan["repeats"])),
                       key=lambda r: r["ttfa_max"]) for n in (1, 16)}
        out[label] = {"options": runs[1]["options"], "ttfa_alone_s": runs[1]["ttfa_max"],
                      "ttfa_among_16_s": runs[16]["ttfa_max"],
                      "first_chunk_error": first_chunk_error(chat, hidden, options)}
    return out


SEED_TARGET = "The request we follow, word for word."
SEED_OTHERS = [f"Another sentence, number {i}, rather longer than the first one." for i in range(15)]


def measure_seeds(chat, steps: int) -> dict:
    """Target 4: a seeded text's codes and hidden states alone, among 8 and among 16 texts, through
    `Chat.speech_requests` + `Chat.gpt(True).generate` (the same seed, other texts around it)."""
    import torch

    from chattts_velocity import InferCodeParams
    from chattts_velocity.text import split_pieces

    params = InferCodeParams(manual_seed=7, max_new_token=steps, min_new_token=steps, show_tqdm=False)

    def target_output(texts: list[str]):
        requests = chat.speech_requests(split_pieces(texts, split=False), params)
        outputs = chat.gpt(True).generate(requests.prompts, requests.sampling, False, max_batch=len(texts))
        return outputs[texts.index(SEED_TARGET)]

    alone = target_output([SEED_TARGET])
    report = {}
    for n in (8, 16):
        batch = target_output(SEED_OTHERS[: n // 2] + [SEED_TARGET] + SEED_OTHERS[n // 2: n - 1])
        report[f"among_{n}"] = {"codes_equal": torch.equal(alone.token_ids, batch.token_ids),
                                "hidden_max_diff": (alone.hidden - batch.hidden).abs().max().item()}
    return report


def measure_llamacpp(args, plan: dict, chats: dict) -> dict:
    if args.no_llamacpp:
        return {"skipped": "--no-llamacpp"}
    try:
        import gguf  # noqa: F401 (only checks that the bench extra is installed)
        import llama_cpp  # noqa: F401 (only checks that the bench extra is installed)
    except ImportError as exc:
        return {"skipped": f"the bench extra is not installed ({exc}); "
                           "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install -e '.[bench]'"}
    from benchmarks.bench_llamacpp import compare

    try:
        return compare(args.model, plan["sizes"], plan["steps"], args.threads, chats, 1)  # 24 cells: one run each
    except RuntimeError as exc:  # llama.cpp itself crashed (in a child process): the rest of the run stands
        return {"skipped": str(exc)}


def target(label: str, measured, met) -> dict:
    return {"target": label, "measured": measured, "met": bool(met) if measured is not None else False}


def targets(report: dict) -> list[dict]:
    """Every target this run measures (docs/performance.md), met or not (target 4's preemption case is in the tests)."""
    m, p, w = report["measured"], ceilings(report), report["weight_bytes_per_step"]
    out = _llamacpp_targets(report["llamacpp"])
    for dtype in ("int8", "bfloat16"):
        ceiling = p["read_gbps"] * 1e9 / w[dtype]
        frac = m[dtype]["one_stream_steps_per_s"] / ceiling
        out.append(target(f"1: one {dtype} stream >= 80% of the bandwidth ceiling ({ceiling:.0f} steps/s)", frac,
                          frac >= 0.8))
    gemm_ceiling = p["gemm_gflops"] * 1e9 / (2 * (w["linear_params"] + w["head_params"]))
    frac = m["bfloat16"]["batch"]["64"]["steps_per_s_e2e"] / gemm_ceiling
    out.append(target(f"2: 64 concurrent bf16 end to end >= 45% of the GEMM ceiling ({gemm_ceiling:.0f} steps/s)",
                      frac, frac >= 0.45))
    for n in (32, 64):
        ratio = m["int8"]["batch"][str(n)]["steps_per_s_e2e"] / m["bfloat16"]["batch"][str(n)]["steps_per_s_e2e"]
        out.append(target(f"3: int8 / bf16 end to end at {n} concurrent >= 0.95", ratio, ratio >= 0.95))
    for dtype in ("bfloat16", "int8"):
        held = all(case["codes_equal"] for case in m["seeds"][dtype].values())
        out.append(target(f"4: a seeded text's codes alone == among 8 and among 16 ({dtype})", float(held), held))
    default = m["streams"]["default"]
    out += [target("5: default stream first audio alone <= 0.3 s (bf16)", default["ttfa_alone_s"],
                   default["ttfa_alone_s"] <= 0.3),
            target("5: default stream first audio among 16 <= 1.0 s (bf16)", default["ttfa_among_16_s"],
                   default["ttfa_among_16_s"] <= 1.0),
            target("5: default first chunk within 1e-4 of the whole-clip decode", default["first_chunk_error"],
                   default["first_chunk_error"] <= 1e-4)]
    share = m["bfloat16"]["batch"]["32"]["decode_share"]
    out.append(target("6: Decoder+Vocos share of end-to-end time at 32 requests (bf16) below 23 %",
                      share, share < 0.23))
    kv = m["kv_int8"]
    label = f"7: int8 KV / bf16 KV decode speed at {kv['seqs']} x {kv['context']} positions > 1"
    if "skipped" in kv:
        out.append({**target(label, None, False), "skipped": kv["skipped"]})
    else:
        out.append(target(label, kv["int8_speedup"], kv["int8_speedup"] > 1.0))
    return out


def ceilings(report: dict) -> dict:
    """The host's ceilings: the better of the probes before and after the run (a ceiling is the best the host
    gave; on a shared host one probe can land in a busy second). gemm_gflops: the better of the bf16 GEMM and the
    contention probe's fp32 GEMM (where the CPU has no bf16 arithmetic, as on the AVX2 path, torch's bf16 GEMM
    crawls and the kernels widen bf16 weights to fp32 FMAs: fp32 is that host's compute ceiling)."""
    probes = (report["probes"], report["probes_after"])
    found = {key: max(p[key] for p in probes) for key in ("read_gbps", "bf16_gemm_gflops")}
    fp32 = max(p.get("contention", {}).get("gflops_all_threads", 0.0) for p in probes)
    return {**found, "gemm_gflops": max(found["bf16_gemm_gflops"], fp32)}


def _llamacpp_targets(llama: dict) -> list[dict]:
    if "skipped" in llama:
        return [{**target("0: at least llama.cpp's speed at every batch size", None, False),
                 "skipped": llama["skipped"]}]
    return [target(f"0: {label} >= 1", ratio, ratio >= 1.0) for label, ratio in llama["ratios"].items()]


def run(args: argparse.Namespace) -> dict:
    import torch

    from benchmarks.bench_decode import kv_ab
    from benchmarks.lib.probe import cpu_identity, thread_settings
    from benchmarks.lib.public import load_chat

    plan = QUICK if args.quick else FULL
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    from chattts_velocity.audio import cpu_decode
    from chattts_velocity.model import kernels

    chats = {dtype: load_chat(args.model, dtype, args.threads) for dtype in DTYPES}
    report = {"cpu": cpu_identity(), "note": args.note, "kernel_path": kernels.kernel_path(), "emulated_isa": args.isa,
              "audio": {dtype: chat.pipeline.precision.describe().rpartition("audio decode ")[2]
                        for dtype, chat in chats.items()} | {"bf16_path": cpu_decode.path()},
              "torch": torch.__version__, "quick": args.quick, "model": args.model,
              "plan": plan, "thread_settings": thread_settings(), "probes": probes(args.threads, plan),
              "weight_bytes_per_step": weight_bytes_per_step(chats["bfloat16"].config)}
    print(f"{report['cpu']}; probes: {report['probes']['read_gbps']:.1f} GB/s read, "
          f"{report['probes']['bf16_gemm_gflops']:.0f} bf16 GFLOP/s", flush=True)
    measured = {}
    for dtype, chat in chats.items():
        measured[dtype] = measure_dtype(chat, plan)
        print(f"{dtype}: {json.dumps(measured[dtype])}", flush=True)
    measured["streams"] = measure_streams(chats["bfloat16"], plan)
    print(f"streams: {json.dumps(measured['streams'])}", flush=True)
    measured["seeds"] = {dtype: measure_seeds(chat, plan["seed_steps"]) for dtype, chat in chats.items()
                         if dtype != "int4"}
    print(f"seeds: {json.dumps(measured['seeds'])}", flush=True)
    measured["kv_int8"] = kv_ab(args.model, "bfloat16", plan["kv_seqs"], plan["kv_context"], plan["repeats"] * 3)
    print(f"int8 KV: {json.dumps(measured['kv_int8'].get('int8_speedup', measured['kv_int8']))}", flush=True)
    report["measured"] = measured
    report["llamacpp"] = measure_llamacpp(args, plan, chats)
    report["probes_after"] = probes(args.threads, plan)
    report["ceilings"] = ceilings(report)
    report["targets"] = targets(report)
    report["seconds"] = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help="asset folder ('demo': random full-size weights)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps, one repeat")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip llama.cpp (recorded as skipped)")
    parser.add_argument("--host-kind", help="override the detected host kind in the file name")
    parser.add_argument("--isa", choices=["avx2"], help="emulate an AVX2-only host on a bigger x86 CPU (set before "
                                                        "torch loads)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--note", default="", help="kept in the JSON, e.g. 'shared host, load 8-16 on 2 vCPUs'")
    args = parser.parse_args(argv)
    if args.isa:
        if "torch" in sys.modules:
            raise SystemExit("--isa must be set before torch is imported: run bench_cpu.py as a script")
        os.environ.update(AVX2_ONLY)
    report = run(args)
    kind = args.host_kind or report["cpu"]["host_kind"] + (f"-as-{args.isa}" if args.isa else "")
    path = Path(args.out) / f"cpu_{kind}{'_quick' if args.quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if "skipped" not in report["llamacpp"]:  # the same figures as bench_llamacpp.py writes alone
        llama = {"cpu": report["cpu"], "probes": report["probes"], **report["llamacpp"]}
        (path.parent / f"llamacpp_{kind}{'_quick' if args.quick else ''}.json").write_text(
            json.dumps(llama, indent=1), encoding="utf-8")
    for item in report["targets"]:
        value = "skipped" if item["measured"] is None else f"{item['measured']:.3g}"
        print(f"{'met   ' if item['met'] else 'MISSED'} {value:>9}  {item['target']}")
    print(f"written to {path} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
