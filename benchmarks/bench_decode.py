"""A decode step's levers, A/B in one process: the variants take turns of a few steps, so host noise hits all alike.

- `backends`: inside one engine, the `cpu` backend (fused C++ layers) against the `torch` backend compiled
  (torch.compile'd layer graphs), each with the AMX panels and without them (the route of CPUs without AMX: every
  linear on the AVX-512 tiles), on N requests already past prefill. Writes results/decode_ab_<dtype>.json.
- `kv`: the KV cache's dtype at long contexts: two engines over the same weights (the cpu backend), bf16 KV against
  int8 KV, each running decode steps of --seqs sequences whose context is --context positions long. Each turn feeds
  the same positions again (context .. context + steps - 1): the pools' contents do not change the work, so nothing
  is prefilled. Writes results/kv_int8.json; bench_cpu.py's target 7 is this A/B (kv_ab).

Every variant runs one untimed turn first; the figures are median ms per step. Full-size random weights
(`.pytest-assets/full` or --model DIR); both need the cpu backend's kernels.

    python -m benchmarks.bench_decode backends --dtype bfloat16 --batches 1,8,32      # and --dtype int8
    python -m benchmarks.bench_decode kv --model .pytest-assets/full --threads 1,2
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.lib.ab import by_name, interleaved

REPO = Path(__file__).resolve().parents[1]

STEPS_PER_TURN = 8
KV_DTYPES = ("auto", "int8")  # kv_cache_dtype; "auto" is the weights' bf16


def alternate(turns: dict[str, Callable[[], None]], rounds: int,
              switch: Callable[[str], None] = lambda name: None) -> dict[str, list[float]]:
    """ms per step of each variant's turns (benchmarks/lib/ab.py): a warm-up round, then `rounds` rounds of every
    turn (switch(name) before each, untimed)."""
    def measure(name: str) -> float:
        switch(name)
        start = time.perf_counter()
        turns[name]()
        return (time.perf_counter() - start) / STEPS_PER_TURN * 1e3

    return by_name(list(turns), interleaved(list(turns), rounds, measure, warm_up=True))


def load(model: str, dtype: str, **engine_options):
    from chattts_velocity import load_pretrained

    try:
        return load_pretrained(model, is_vllm=True, dtype=dtype, backend="cpu", **engine_options)
    except ValueError as exc:  # e.g. the CPU kernels do not run here
        raise SystemExit(f"error: {exc}") from None


# --- backends -------------------------------------------------------------------------------------------------------

def backend_variants(runner) -> dict[str, Callable[[], None]]:
    """name -> a function that switches the runner to that decode backend and kernel layout."""
    from chattts_velocity.engine.worker.backends.torch_backend import CompiledTorchBackend
    from chattts_velocity.model import kernels
    from chattts_velocity.model.fused import FusedLayerWeights

    cpu = runner.backend
    compiled = CompiledTorchBackend(runner.model, cpu.kv, runner.act_dtype)  # over the same KV pool
    packed = [m for m in runner.model.modules() if getattr(m, "kernel", None) == "amx"]
    layouts = {id(m): {True: m.packed, False: kernels.to_tiles(kernels.from_panels(m.packed),
                                                               16 if m.mode == "int8" else 32)} for m in packed}

    def use(backend, amx: bool) -> Callable[[], None]:
        def switch() -> None:
            runner.backend = backend
            for m in packed:
                m.packed = layouts[id(m)][amx]
            cpu.fused.layers = [FusedLayerWeights.of(layer) for layer in runner.model.layers]
        return switch

    if not packed:  # no AMX on this CPU
        return {"fused, no AMX": use(cpu, False), "compiled, no AMX": use(compiled, False)}
    return {"fused + AMX": use(cpu, True), "fused, no AMX": use(cpu, False), "compiled + AMX": use(compiled, True),
            "compiled, no AMX": use(compiled, False)}


def backends_batch(llm, model: str, batch: int, variants: dict, args: argparse.Namespace) -> dict[str, float]:
    """Median ms per step of each variant, on `batch` requests past --warm-steps steps."""
    from chattts_velocity.params import InferCodeParams
    from chattts_velocity.text import Tokenizer, sample_random_speaker

    engine = llm.engine
    torch.manual_seed(0)
    speaker = sample_random_speaker(llm.config.hidden_size)
    steps = args.warm_steps + (args.rounds + 1) * len(variants) * STEPS_PER_TURN + 1
    params = InferCodeParams(spk_emb=speaker, max_new_token=steps, min_new_token=steps,
                             show_tqdm=False).to_sampling_params("code", 625, return_hidden=True)
    tokenizer = Tokenizer(Path(model) / "asset" / "tokenizer")
    for i in range(batch):
        engine.add_request(None, tokenizer.code_prompt(f"Request number {i} of the decode benchmark.", speaker), params)
    for _ in range(args.warm_steps):
        engine.step()

    def turn() -> None:
        for _ in range(STEPS_PER_TURN):
            engine.step()

    ms = alternate(dict.fromkeys(variants, turn), args.rounds, lambda name: variants[name]())
    next(iter(variants.values()))()
    while engine.has_unfinished_requests():
        engine.step()
    return {name: statistics.median(t) for name, t in ms.items()}


def backends(args: argparse.Namespace) -> tuple[dict, str]:
    llm = load(args.model, args.dtype)
    variants = backend_variants(llm.engine.runner)
    report = {"dtype": args.dtype, "threads": torch.get_num_threads(), "steps_per_turn": STEPS_PER_TURN,
              "batches": {}}
    for batch in args.batches:
        ms = backends_batch(llm, args.model, batch, variants, args)
        baseline = list(ms)[-1]  # compiled without AMX: the step before the fused layer and AMX
        ratios = {name: ms[baseline] / t for name, t in ms.items()}
        report["batches"][str(batch)] = {"ms_per_step_median": ms, f"speedup_vs_{baseline}": ratios}
        print(f"N={batch}: " + ", ".join(f"{name} {t:.1f} ms ({ratios[name]:.2f}x)" for name, t in ms.items()))
    return report, args.name or f"decode_ab_{args.dtype}"


# --- kv -------------------------------------------------------------------------------------------------------------

def kv_turn(engine, seqs: int, context: int) -> Callable[[], None]:
    """A function running STEPS_PER_TURN decode steps of `seqs` sequences at positions context, context + 1, ..."""
    from chattts_velocity.engine.worker.step_inputs import StepTensors

    runner, bs = engine.runner, engine.runner.block_size
    width = -(-(context + STEPS_PER_TURN) // bs)
    if seqs * width > engine.block_manager.num_blocks:
        raise SystemExit(f"error: {seqs} x {context} positions need {seqs * width} blocks, the pool has "
                         f"{engine.block_manager.num_blocks}")
    tables = [list(range(b * width, (b + 1) * width)) for b in range(seqs)]
    ids = torch.randint(0, 625, (seqs, 4), generator=torch.Generator().manual_seed(0))  # [B, 4] codes
    embeds = runner.embed.embed(ids, torch.zeros(seqs, dtype=torch.bool)).to(runner.act_dtype)

    @torch.inference_mode()
    def turn() -> None:
        for t in range(STEPS_PER_TURN):
            position = context + t
            step = StepTensors.from_lists([1] * seqs, [position + 1] * seqs,
                                          [table[: position // bs + 1] for table in tables], bs, runner.device)
            runner.backend.run(embeds, step)
    return turn


def kv_turns(model: str, dtype: str, seqs: int, context: int) -> dict[str, Callable[[], None]]:
    # the default 1 GiB pool: 1092 full-size bf16 blocks of 16 positions; 32 x 308 positions take 640
    return {kv: kv_turn(load(model, dtype, kv_cache_dtype=kv).engine, seqs, context) for kv in KV_DTYPES}


def kv_summary(ms: dict[str, list[float]]) -> dict:
    median = {kv: statistics.median(t) for kv, t in ms.items()}
    return {"ms_per_step": ms, "ms_per_step_median": median,
            "steps_per_s_median": {kv: 1e3 / t for kv, t in median.items()},
            "int8_speedup": median["auto"] / median["int8"]}


def kv_ab(model: str, dtype: str, seqs: int, context: int, rounds: int) -> dict:
    """bench_cpu.py's target 7 on the caller's threads: {"seqs", "context", "dtype", "int8_speedup", ...}, or
    {..., "skipped": why} where the cpu backend cannot run (int8 KV needs it)."""
    from chattts_velocity.demo import ensure_model

    try:
        turns = kv_turns(str(ensure_model(model)[0]), dtype, seqs, context)
    except SystemExit as exc:  # e.g. head_dim 16 (tiny weights) or no AVX-512 BF16
        return {"seqs": seqs, "context": context, "dtype": dtype, "skipped": str(exc)}
    return {"seqs": seqs, "context": context, "dtype": dtype, **kv_summary(alternate(turns, rounds))}


def kv(args: argparse.Namespace) -> tuple[dict, str]:
    turns = kv_turns(args.model, args.dtype, args.seqs, args.context)
    report = {"dtype": args.dtype, "seqs": args.seqs, "context": args.context, "steps_per_turn": STEPS_PER_TURN,
              "rounds": args.rounds, "threads": {}}
    for threads in args.threads:
        torch.set_num_threads(threads)
        report["threads"][str(threads)] = result = kv_summary(alternate(turns, args.rounds))
        median = result["ms_per_step_median"]
        print(f"{threads} thread(s), {args.seqs} x {args.context} positions, {args.dtype} weights: bf16 KV "
              f"{median['auto']:.1f} ms/step ({1e3 / median['auto']:.2f} steps/s), int8 KV {median['int8']:.1f} "
              f"ms/step ({1e3 / median['int8']:.2f} steps/s): {result['int8_speedup']:.2f}x")
    return report, args.name or "kv_int8"


def parser() -> argparse.ArgumentParser:
    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",")]

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", default=str(REPO / ".pytest-assets" / "full"))
    common.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "int8"], help="the weights' precision")
    common.add_argument("--name", help="results/<name>.json (default decode_ab_<dtype>, kv_int8)")
    common.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    top = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    levers = top.add_subparsers(dest="lever", required=True)
    b = levers.add_parser("backends", parents=[common], help="fused C++ vs compiled torch, AMX or not")
    b.add_argument("--batches", type=ints, default=[1, 8, 32])
    b.add_argument("--rounds", type=int, default=6, help="timed turns per variant (default 6)")
    b.add_argument("--warm-steps", type=int, default=30, help="steps before timing (context grows)")
    k = levers.add_parser("kv", parents=[common], help="bf16 KV cache vs int8 KV cache at long contexts")
    k.add_argument("--seqs", type=int, default=32)
    k.add_argument("--context", type=int, default=300, help="positions already in each sequence's KV cache")
    k.add_argument("--rounds", type=int, default=5, help="timed turns per KV dtype (default 5)")
    k.add_argument("--threads", type=ints, default=[torch.get_num_threads()],
                   help="torch threads, one A/B per count (default: torch's)")
    return top


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    report, name = (backends if args.lever == "backends" else kv)(args)
    path = Path(args.out) / f"{name}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"results written to {path}")
    return report


if __name__ == "__main__":
    main()
