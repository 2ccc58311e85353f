"""The CPU kernel paths against each other on this host, in one run, through the public API on full-size weights.

Paths: torch's own kernels (what a CPU without our kernels runs), the AVX2 kernels (any x86 CPU with AVX2 + FMA),
and the AVX-512 tiles where the CPU has AVX-512 BF16 (the AMX panels are bench_cpu.py's subject). On an AVX-512
host the AVX2 rows emulate an AVX2-only host: CHATTTS_VELOCITY_CPU_KERNELS=avx2 for ours, and
ONEDNN_MAX_CPU_ISA=AVX2 + ATEN_CPU_CAPABILITY=avx2 so torch's fallback kernels use AVX2 only too (memory bandwidth
and core count stay this host's, so the figures are ratios, not an AVX2 laptop's speed). Each (path, precision)
runs in its own process: load, warm up, then code
steps per second with prefill excluded (lib/public.py, decode_rate) for one stream and for 16 concurrent; the
processes are interleaved over the repeats and each cell keeps its best. On a shared host wall-clock rates swing
with the neighbours' load, so the run also times the 80 linears of one step on each ISA's kernels in one process
(one thread, CPU time, interleaved, best of 7): the steadier same-run ratio of the kernels themselves.

    python -m benchmarks.bench_isa --model .pytest-assets/full          # ~10 min on 2 threads; run it ALONE
    python -m benchmarks.bench_isa --table benchmarks/results/isa_spr-amx.json   # the markdown table of a run

Writes results/isa_<hostkind>.json: the CPU, the plan, every repeat's figures and each cell's best.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.ab import by_name, interleaved

REPO = Path(__file__).resolve().parents[1]

AVX2_ONLY = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
PATHS = {  # label -> (environment, precisions, CPU flags it needs)
    "torch, AVX2": ({"CHATTTS_VELOCITY_CPU_KERNELS": "0", **AVX2_ONLY}, ("float32", "bfloat16", "int8"), ("avx2",)),
    "avx2": ({"CHATTTS_VELOCITY_CPU_KERNELS": "avx2", **AVX2_ONLY}, ("bfloat16", "int8", "int4"), ("avx2", "fma")),
    "avx512": ({"CHATTTS_VELOCITY_CPU_KERNELS": "noamx"}, ("bfloat16", "int8", "int4"), ("avx512_bf16",)),
}
SIZES = (1, 16)
ARGS_KIND: dict = {}  # the file's host kind and folder, from the command line


def child(model: str, dtype: str, steps: int, threads: int) -> dict:
    """One (path, precision) in this process: steps/s at each size and the kernel path the load line names."""
    from benchmarks.lib.public import decode_rate, load_chat
    from chattts_velocity.model import kernels

    chat = load_chat(model, dtype, threads)
    decode_rate(chat, 1, 4)  # warm-up
    rates = {str(n): decode_rate(chat, n, steps) for n in SIZES}
    return {"steps_per_s": rates, "kernel_path": kernels.kernel_path() if dtype != "float32" else "torch",
            "backend": chat.engine().runner.backend.name}


def linears(layers: int = 10, repeats: int = 7) -> dict:
    """CPU milliseconds of `layers` layers' projections (full-size shapes) per ISA library and precision (int8_q8:
    the int8 tiles times Q8 rows), at 1 and 16 rows, one thread; every ISA this CPU runs, interleaved."""
    import torch

    from chattts_velocity.model import kernels
    from chattts_velocity.model.packed import _quantize_int8

    shapes = [(2304, 768), (768, 768), (6144, 768), (768, 3072)]  # fused q/k/v, o, fused gate/up, down
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(layers) for n, k in shapes]
    packed = {"bfloat16": [(kernels.to_tiles(w.bfloat16(), 32),) for w in weights],
              "int8": [(kernels.to_tiles(q, 16), s) for q, s in map(_quantize_int8, weights)],
              "int4": [kernels.to_int4_tiles(*kernels.quantize_int4(w)) for w in weights]}
    packed["int8_q8"] = packed["int8"]  # the same int8 tiles times x's Q8 rows (CHATTTS_VELOCITY_INT8_ACTIVATIONS=q8)
    names = {"bfloat16": "linear_bf16", "int8": "linear_int8", "int8_q8": "linear_int8_q8", "int4": "linear_int4"}
    isas = [name for name in ("avx512", "avx2") if set(kernels.ISAS[name].cpu_flags) <= kernels.cpu_flags()]
    out = {}
    for rows in SIZES:
        x = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in (768, 3072)}
        variants = {}
        for which in isas:
            for dtype, tensors in packed.items():
                op = getattr(kernels.ops(which), names[dtype])
                variants[f"{which} {dtype}"] = lambda op=op, tensors=tensors, x=x: [
                    op(x[k_of(w)], w, *rest) for w, *rest in tensors]

        def measure(name: str, variants: dict = variants) -> float:
            start = time.process_time()
            variants[name]()
            return (time.process_time() - start) * 1e3

        with torch.inference_mode():
            times = by_name(list(variants), interleaved(list(variants), repeats, measure))
        out[str(rows)] = {name: min(t) for name, t in times.items()}
    return {"layers": layers, "repeats": repeats, "threads": 1, "cpu_ms_best": out}


def k_of(tiles) -> int:
    """Input features of a tile-layout weight: [N/4, K/C, 4, C] (bf16 C = 32, int8 C = 16), int4 [N/4, K/32, 4, 16]."""
    return tiles.shape[1] * (16 if tiles.dtype.is_signed and tiles.element_size() == 1 else 32)


def run(args: argparse.Namespace) -> dict:
    from benchmarks.lib.probe import cpu_identity

    cpu = cpu_identity()
    flags = set(cpu["flags"]) | {"fma"}  # cpu_identity lists the matmul flags only; every AVX2 CPU has FMA
    cells = [(label, dtype) for label, (_, dtypes, needs) in PATHS.items() if set(needs) <= flags
             for dtype in dtypes]
    runs: dict[str, list] = {f"{label} | {dtype}": [] for label, dtype in cells}
    start = time.perf_counter()

    def measure(cell: tuple[str, str]) -> dict:
        label, dtype = cell
        env = {**os.environ, **PATHS[label][0], "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", "benchmarks.bench_isa", "--child", "--model", args.model, "--dtype", dtype,
                   "--steps", str(args.steps), "--threads", str(args.threads)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200, cwd=str(REPO))
        if done.returncode != 0:
            raise RuntimeError(f"{label} {dtype}: {done.stderr[-2000:]}")
        result: dict = json.loads(done.stdout.strip().splitlines()[-1])
        runs[f"{label} | {dtype}"].append(result)
        print(f"{label:12s} {dtype:9s} {result}", flush=True)
        save(report(args, cpu, runs, None, start))  # a partial file after every cell
        return result

    interleaved(cells, args.repeats, measure)
    return report(args, cpu, runs, linears(), start)


def report(args: argparse.Namespace, cpu: dict, runs: dict, kernels_ms: dict | None, start: float) -> dict:
    best = {key: {n: max(r["steps_per_s"][n] for r in results) for n in map(str, SIZES)}
            for key, results in runs.items() if results}
    return {"cpu": cpu, "model": args.model, "linears": kernels_ms, "threads": args.threads, "steps": args.steps,
            "repeats": args.repeats, "complete": kernels_ms is not None,
            "paths": {label: {"env": env, "precisions": list(dtypes)} for label, (env, dtypes, _) in PATHS.items()},
            "runs": runs, "best_steps_per_s": best, "seconds": time.perf_counter() - start}


def save(data: dict) -> Path:
    kind = ARGS_KIND.get("kind") or data["cpu"]["host_kind"]
    path = Path(ARGS_KIND["out"]) / f"isa_{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def table(report: dict) -> str:
    """Markdown: one row per (path, precision), steps/s at 1 and 16 sequences and the ratio to torch's bf16."""
    best = report["best_steps_per_s"]
    base = best.get("torch, AVX2 | bfloat16")
    head = "| path | precision | 1 sequence, steps/s | 16 sequences, steps/s | vs torch bf16 at 1 / 16 |"
    lines = [head, "|---|---|---|---|---|"]
    for key, rates in best.items():
        label, dtype = key.split(" | ")
        ratio = (f"{rates['1'] / base['1']:.2f}x / {rates['16'] / base['16']:.2f}x" if base else "-")
        lines.append(f"| {label} | {dtype} | {rates['1']:.1f} | {rates['16']:.1f} | {ratio} |")
    if report.get("linears"):
        lines += ["", linears_table(report["linears"])]
    return "\n".join(lines)


def linears_table(linears_report: dict) -> str:
    """Markdown: CPU ms of the linears per (ISA, precision) at 1 and 16 rows, and AVX2 / AVX-512."""
    ms = linears_report["cpu_ms_best"]
    lines = [f"| {linears_report['layers']} layers' linears, 1 thread, CPU ms (best of {linears_report['repeats']}) "
             "| 1 row | 16 rows | AVX2 time / AVX-512 time at 1 / 16 |", "|---|---|---|---|"]
    for name in ms["1"]:
        which, dtype = name.split(" ")
        other = f"avx512 {dtype}" if which == "avx2" else None
        ratio = (f"{ms['1'][name] / ms['1'][other]:.2f} / {ms['16'][name] / ms['16'][other]:.2f}"
                 if other in ms["1"] else "-")
        lines.append(f"| {name} | {ms['1'][name]:.1f} | {ms['16'][name]:.1f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help="asset folder ('demo': random full-size weights)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=48, help="timed code steps per measurement")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--host-kind", help="override the detected host kind in the file name")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--table", help="print the markdown table of this results file and exit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text(encoding="utf-8"))))
        return
    if args.child:
        print(json.dumps(child(args.model, args.dtype, args.steps, args.threads)))
        return
    ARGS_KIND.update(kind=args.host_kind, out=args.out)
    data = run(args)
    path = save(data)
    print(table(data))
    print(f"written to {path} in {data['seconds']:.0f} s")


if __name__ == "__main__":
    main()
