"""Where a GPU decode step's device time goes, kernel by kernel, and what other GEMM tiles would give.

1. `kernels`: a steady decode step of N sequences on the triton backend (bf16, random demo weights, the default
   max_model_len, prompts of 100-300 positions and 150 warm steps: contexts of ~300-450, as gpu_check.py's steady
   decode) under torch.profiler: per kernel name, launches and microseconds per step (graph replays included),
   largest first.
1b. `gemm_tbs`: each layer GEMM alone (default tiles) at 1/16/64/256 rows, achieved TB/s (gpu_check_parts.gemm_tbs),
   beside `bandwidth_tbs`, the card's.
2. `tiles`: each fused GEMM kernel alone (the decode layer's q|k|v, o, gate|up and down in bf16, the code heads in
   fp32 as a step runs them) at M rows, median of triton.testing.do_bench (L2 flushed between runs, so the weights
   come from HBM as in a step) for tiles x split-K targets (split_k.splits_for's program target; 0: no split);
   `hbm_us` is the weight's bytes at the card's bandwidth. A tile and a split depend on the weight only, never on M
   (the batch-invariance rule), so one choice per kernel must serve every M.
3. `attention`: the decode attention alone (12 heads of 64, bf16 pools of 16-position blocks) at 1/16/64 sequences
   and contexts 300/600 for each split length (positions per split: a constant, so the split count depends on a
   sequence's own context only).
Each part runs under its own time limit (PART_SECONDS, gpu_check.timed_part) and is saved as it ends; one that
fails or runs out of time is recorded under `errors`.

    python -m benchmarks.profile_gpu_kernels --out benchmarks/results/profile_gpu_kernels.json
"""
from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

from benchmarks import gpu_check_parts as parts
from benchmarks.gpu_check import timed_part

PART_SECONDS = {"kernels": 40, "gemm": 15, "attention": 15, "tiles": 25}  # 95 s, inside gpu_check.sh's limit
WARM_STEPS = 150  # decode steps before the profile: contexts from the prompts' 100-300 to ~250-450
REPO = Path(__file__).resolve().parents[1]

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, maxnreg): gemm.HALF_TILE first, its neighbours, the former 16 x 16 tile
TILES = [(64, 32, 64, 4, 4, 168), (64, 32, 64, 4, 3, 168), (64, 64, 64, 4, 4, 168), (64, 32, 128, 4, 3, 168),
         (64, 16, 64, 4, 4, 168), (16, 16, 64, 4, 3, None)]
TARGETS = (0, 132, 264, 528)  # split-K program targets (0: one K range; 264: split_k.TARGET_PROGRAMS)
ROWS = (1, 16, 64, 256)


def kernel_table(engine, n: int, steps: int) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ids = [engine.add_request(f"prof{n}-{i}", parts.prompt(engine, i), parts.forced(WARM_STEPS + steps + 16, i))
           for i in range(n)]
    for _ in range(WARM_STEPS):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name[:90]]
            entry[0] += 1
            entry[1] += event.device_time_total
    for rid in ids:
        engine.abort_request(rid)
    rows = [{"kernel": name, "per_step": count / steps, "us_per_step": round(us / steps, 2)}
            for name, (count, us) in totals.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def gemm_cases(device, hidden: int, inter: int, heads: int, head_dim: int, vocab_rows: int):
    """name -> (weight bytes, columns (pairs in the two-output kernels), K, call(M, tile, splits) -> callable)."""
    import torch

    from chattts_velocity.model.kernels.triton import gemm, qkv

    def w(n: int, k: int, dtype=torch.bfloat16) -> torch.Tensor:
        return torch.randn(n, k, device=device, dtype=dtype) * 0.02

    weights = {"qkv": w(3 * hidden, hidden), "o": w(hidden, hidden), "gate_up": w(2 * inter, hidden),
               "down": w(hidden, inter), "heads": w(vocab_rows, hidden, torch.float32)}
    columns = {"qkv": 3 * hidden // 2, "o": hidden, "gate_up": inter, "down": hidden, "heads": vocab_rows}
    norm = torch.ones(hidden, device=device, dtype=torch.bfloat16)
    pool = torch.zeros(64, 16, heads, head_dim, device=device, dtype=torch.bfloat16)
    cos = torch.ones(4096, head_dim, device=device)
    sin = torch.zeros(4096, head_dim, device=device)

    def call(name: str, m: int, tile, splits: int):
        weight = weights[name]
        x = torch.randn(m, weight.shape[1], device=device, dtype=weight.dtype)
        if name == "qkv":
            pos = torch.arange(m, device=device)
            return lambda: qkv.norm_qkv_rope(x, norm, weight, pos, pos % (64 * 16), cos, sin, pool, pool, 1e-6,
                                             tile=tile, splits=splits)
        if name == "gate_up":
            return lambda: gemm.norm_gate_up(x, norm, weight, 1e-6, tile=tile, splits=splits)
        if name == "heads":
            return lambda: gemm.linear(x, weight, tile=tile, splits=splits)
        residual = torch.randn(m, weight.shape[0], device=device, dtype=weight.dtype)
        return lambda: gemm.residual_linear(x, weight, residual, tile=tile, splits=splits)

    return {name: (t.numel() * t.element_size(), columns[name], t.shape[1]) for name, t in weights.items()}, call


def tile_sweep(device, bandwidth_tbs: float, save=lambda partial: None) -> dict:
    """name -> weight MB, HBM us, tiles x splits -> {M: median us}, best choices; save(partial) after each GEMM."""
    import triton
    import triton.testing

    from chattts_velocity.model.kernels.triton.gemm import Tile
    from chattts_velocity.model.kernels.triton.split_k import splits_for

    sizes, call = gemm_cases(device, 768, 3072, 12, 64, 4 * 626)
    out: dict = {}
    for name, (nbytes, columns, k) in sizes.items():
        entry = out[name] = {"weight_mb": round(nbytes / 1e6, 2), "hbm_us": round(nbytes / bandwidth_tbs / 1e6, 2),
                             "tiles": {}}
        for spec in TILES:
            tile = Tile(*spec)
            tiles, chunks = triton.cdiv(columns, tile.block_n), triton.cdiv(k, tile.block_k)
            for splits in sorted({splits_for(tiles, chunks, target) if target else 1 for target in TARGETS}):
                label = "m{}n{}k{}w{}s{}".format(*spec) + f"x{splits}"
                try:
                    entry["tiles"][label] = {str(m): round(1e3 * triton.testing.do_bench(
                        call(name, m, tile, splits), warmup=5, rep=25, return_mode="median"), 2) for m in ROWS}
                except Exception as error:  # noqa: BLE001 -- a tile that does not compile is a finding, not a stop
                    entry["tiles"][label] = f"{type(error).__name__}: {str(error)[:120]}"
        timed = {k: v for k, v in entry["tiles"].items() if isinstance(v, dict)}
        entry["best_at_1"] = min(timed, key=lambda k: timed[k]["1"]) if timed else None
        entry["best_sum"] = min(timed, key=lambda k: sum(timed[k].values())) if timed else None
        save(out)
    return out


SPLIT_LENS = (32, 64, 128, 256)
HEADS, HEAD_DIM, BLOCK = 12, 64, 16  # ChatTTS's attention, the engine's default block size


def _attention_us(da, device, batch: int, context: int, split_len: int) -> float:
    import torch
    import triton.testing

    per_seq = -(-context // BLOCK)
    pools = [torch.randn(batch * per_seq + 1, BLOCK, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
             for _ in range(2)]
    tables = torch.arange(batch * per_seq, device=device).view(batch, per_seq)
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn(batch, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    space = da.Workspace.allocate(batch, HEADS, per_seq * BLOCK, HEAD_DIM, device, split_len)
    return round(1e3 * triton.testing.do_bench(
        lambda: da.paged_decode_attention(q, pools[0], pools[1], tables, lens, space, split_len=split_len),
        warmup=5, rep=25, return_mode="median"), 2)


def attention_sweep(device) -> dict:
    """split_len -> "B x context" -> median us of one decode attention."""
    from chattts_velocity.model.kernels.triton import decode_attention as da

    out: dict = {}
    for split_len in SPLIT_LENS:
        row = out[str(split_len)] = {}
        for batch in (1, 16, 64):
            for context in (300, 600):
                row[f"{batch}x{context}"] = _attention_us(da, device, batch, context, split_len)
    return out


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bandwidth-tbs", type=float, default=None,
                        help="the card's HBM bandwidth (default: from its name, else measured)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "profile_gpu_kernels.json"))
    args = parser.parse_args()
    device = torch.device("cuda")
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                    "kernels": {}, "gemm_tbs": None, "attention": None, "tiles": None, "errors": {}, "seconds": {}}
    out = Path(args.out)
    start = time.perf_counter()

    def save(report: dict) -> None:
        out.write_text(json.dumps(report, indent=1), encoding="utf-8")

    with torch.inference_mode():
        import triton

        from chattts_velocity import load_pretrained
        from chattts_velocity.demo import ensure_model

        report["triton"] = triton.__version__
        if args.bandwidth_tbs:
            report["bandwidth_tbs"], report["bandwidth_from"] = args.bandwidth_tbs, "--bandwidth-tbs"
        else:
            report["bandwidth_tbs"], report["bandwidth_from"] = parts.bandwidth_tbs(device)
        llm = load_pretrained(ensure_model("demo")[0], is_vllm=True, device="cuda", dtype="bfloat16",
                              backend="triton", max_num_seqs=256)
        report["max_model_len"] = llm.engine.engine_config.max_model_len

        def kernels() -> None:
            for n in (int(s) for s in args.sizes.split(",")):
                report["kernels"][str(n)] = kernel_table(llm.engine, n, args.steps)

        def gemms() -> None:
            report["gemm_tbs"] = parts.gemm_tbs(device)

        def attention() -> None:
            report["attention"] = attention_sweep(device)

        def tiles() -> None:
            def partial(tiles: dict) -> None:
                report["tiles"] = tiles
                save(report)

            report["tiles"] = tile_sweep(device, report["bandwidth_tbs"], partial)

        timed_part(report, "kernels", kernels, PART_SECONDS["kernels"], save, lambda: parts.drain(llm.engine))
        llm.shutdown()
        for name, fn in (("gemm", gemms), ("attention", attention), ("tiles", tiles)):
            timed_part(report, name, fn, PART_SECONDS[name], save)
    report["seconds"]["total"] = round(time.perf_counter() - start, 1)
    save(report)
    for n, rows in report["kernels"].items():
        if isinstance(rows, str):
            print(f"n={n}: {rows}")
            continue
        print(f"n={n}: {sum(r['us_per_step'] for r in rows):.0f} us/step", *rows[:12], sep="\n  ")
    for name, per_m in (report["gemm_tbs"] or {}).items():
        print("gemm", name, "TB/s by rows:", per_m)
    for split_len, times in (report["attention"] or {}).items():
        print("attention split", split_len, times)
    for name, entry in (report["tiles"] or {}).items():
        print(name, entry["weight_mb"], "MB, HBM", entry["hbm_us"], "us; best at 1:", entry["best_at_1"],
              "best over M:", entry["best_sum"])
        for label, times in entry["tiles"].items():
            print("  ", label, times)


if __name__ == "__main__":
    main()
