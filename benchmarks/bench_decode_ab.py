"""A/B of the decode backends inside one engine: `cpu` (fused C++ layers) or `torch` compiled (torch.compile'd layer
graphs), each with the AMX panels or without them, switched every few steps on the same requests (so host noise hits
all alike).

Full-size random weights (`.pytest-assets/full` or `--model DIR`), N concurrent requests already past prefill.
Usage: python benchmarks/bench_decode_ab.py [--dtype bfloat16] [--batches 1,8,32] [--rounds 6] [--name NAME]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chattts_velocity import load_pretrained  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.engine.backends.torch_backend import CompiledTorchBackend  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.model import kernels  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.model.fused import FusedLayerWeights  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.params import InferCodeParams  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.text import Tokenizer, sample_random_speaker  # noqa: E402 (imported once REPO is on sys.path)

STEPS_PER_TURN = 8


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ".pytest-assets" / "full"))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "int8"])
    parser.add_argument("--batches", type=lambda v: [int(b) for b in v.split(",")], default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=6, help="turns per variant (default 6)")
    parser.add_argument("--warm-steps", type=int, default=30, help="steps before timing (context grows)")
    parser.add_argument("--name", default=None, help="results/<name>.json (default decode_ab_<dtype>)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    try:
        llm = load_pretrained(args.model, is_vllm=True, dtype=args.dtype, backend="cpu")
    except ValueError as exc:  # e.g. the CPU kernels do not run here
        raise SystemExit(f"error: {exc}") from None
    runner = llm.engine.runner
    compiled = CompiledTorchBackend(runner.model, runner.backend.kv, runner.act_dtype)  # over the same KV pool
    variants = _variants(runner, runner.backend, compiled)
    report = {"dtype": args.dtype, "threads": torch.get_num_threads(), "steps_per_turn": STEPS_PER_TURN,
              "batches": {}}
    for batch in args.batches:
        ms = _run_batch(llm, batch, variants, args)
        baseline = list(ms)[-1]  # compiled without AMX: the step before the fused layer and AMX
        ratios = {name: ms[baseline] / t for name, t in ms.items()}
        report["batches"][str(batch)] = {"ms_per_step_median": ms, f"speedup_vs_{baseline}": ratios}
        print(f"N={batch}: " + ", ".join(f"{name} {t:.1f} ms ({ratios[name]:.2f}x)" for name, t in ms.items()))
    path = Path(args.out) / f"{args.name or 'decode_ab_' + args.dtype}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"results written to {path}")


def _variants(runner, cpu, compiled) -> dict[str, callable]:
    """name -> a function that switches the runner to that decode backend and kernel layout.

    "no AMX" is the route of CPUs without AMX: every linear on the AVX-512 tiles (rebuilt from the AMX panels).
    """
    packed = [m for m in runner.model.modules() if getattr(m, "kernel", None) == "amx"]
    layouts = {id(m): {True: m.packed, False: kernels.to_tiles(kernels.from_panels(m.packed),
                                                               16 if m.mode == "int8" else 32)} for m in packed}

    def use(backend, amx: bool):
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


def _run_batch(llm, batch: int, variants: dict, args) -> dict[str, float]:
    engine = llm.engine
    tok = Tokenizer(Path(args.model) / "asset" / "tokenizer")
    torch.manual_seed(0)
    speaker = sample_random_speaker(llm.config.hidden_size)
    steps = args.warm_steps + args.rounds * len(variants) * STEPS_PER_TURN + 1
    params = InferCodeParams(spk_emb=speaker, max_new_token=steps, min_new_token=steps,
                             show_tqdm=False).to_sampling_params("code", 625, return_hidden=True)
    for i in range(batch):
        engine.add_request(None, tok.code_prompt(f"Request number {i} of the decode benchmark.", speaker), params)
    for _ in range(args.warm_steps):
        engine.step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, switch in variants.items():
            switch()
            start = time.perf_counter()
            for _ in range(STEPS_PER_TURN):
                engine.step()
            times[name].append((time.perf_counter() - start) / STEPS_PER_TURN * 1e3)
    next(iter(variants.values()))()
    while engine.has_unfinished_requests():
        engine.step()
    return {name: statistics.median(t) for name, t in times.items()}


if __name__ == "__main__":
    main()
