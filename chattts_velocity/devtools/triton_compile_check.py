"""Engine stage, CUDA backend, checks: compile every Triton kernel the engine launches for real GPU targets, here.

No GPU is needed: Triton compiles for a named target (`GPUTarget("cuda", cc, 32)`) with its bundled ptxas, and
cuobjdump reads the registers, shared memory and local (spilled) memory of each cubin. This runs the code paths the
CPU interpreter never takes (the bf16/fp16 tensor-core tl.dot of the prefill kernel, the real register allocator),
and each result names what the PTX uses (`instructions`): the tensor-core MMA (wgmma / mma.sync), the async copies
that feed it, and whether the weights' L2 prefetch precedes the PDL wait. Arguments are specialised as a launch
specialises them (16-byte aligned pointers, integers divisible by 16), so the loads vectorise as on a GPU.

What is compiled is recorded, not listed by hand: a child process runs TritonBackend steps (decode, prefill) and
the device sampler (code and text vocabularies) under TRITON_INTERPRET=1 with each launch captured instead of run,
for ChatTTS's widths and the tests' sizes (two layers: the second's norms read the statistics the first left),
fp32/bf16/fp16 weights and pools and block sizes 4 and 16, as a GPU launches them (the interpreter's fp32 upcast
off), and a steady step's own kernels (its inputs, the final norm into fp32, the heads' GEMM). Kernels with a
USE_PDL switch compile for sm_90 as Hopper launches them: with Programmatic Dependent Launch.

    python -m chattts_velocity.devtools.triton_compile_check --out benchmarks/results/triton_compile.json
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGETS = {80: 166912, 89: 101376, 90: 232448}  # compute capability -> opt-in shared memory per block (bytes)
MODELS = {"chattts": (768, 12, 3072), "test": (64, 4, 128)}  # hidden, heads, intermediate
DTYPES = ("float32", "bfloat16", "float16")
BLOCK_SIZES = (4, 16)
TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int64": "i64", "int32": "i32", "bool": "i1",
         "uint8": "u8", "int8": "i8"}
PACKAGE = Path(__file__).parents[1]
KERNELS = PACKAGE / "model" / "kernels" / "triton"
ENGINE = PACKAGE / "engine" / "worker"
MODULE = "chattts_velocity.devtools.triton_compile_check"
Spec = dict[str, Any]  # one launch: kernel, signature, constexprs, options (JSON)


def record() -> list[Spec]:
    """Every distinct launch of the engine's kernels (run in a TRITON_INTERPRET=1 process)."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    from chattts_velocity.model.kernels.triton import gemm, prefill_attention

    launches: dict[str, Spec] = {}

    def capture(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        spec = _spec(self, args, kwargs)
        launches[json.dumps(spec, sort_keys=True)] = spec

    prefill_attention.INTERPRETED = gemm.INTERPRETED = False  # record UPCAST as a GPU launch decides it
    InterpretedFunction.run = capture
    with torch.inference_mode():
        for hidden, heads, inter in MODELS.values():
            for dtype in DTYPES:
                for block_size in BLOCK_SIZES:
                    _drive_backend(hidden, heads, inter, getattr(torch, dtype), block_size)  # warm-up: + sampler
    return list(launches.values())


def _spec(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Spec:
    """Triton's view of one launch: argument types, constexpr values, compile options."""
    fn = kernel.fn
    params = inspect.signature(fn).parameters
    names = list(params)
    values = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
    skip = set(kernel.kwargs.get("do_not_specialize") or ()) if hasattr(kernel, "kwargs") else set()
    signature, constexprs, aligned = {}, {}, []
    for name in names:
        value = values[name]
        if "constexpr" in str(params[name].annotation):
            signature[name], constexprs[name] = "constexpr", value
        elif hasattr(value, "dtype") and hasattr(value, "data_ptr"):
            signature[name] = "*" + TYPES[str(value.dtype).removeprefix("torch.")]
            aligned += [name] if value.data_ptr() % 16 == 0 else []
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and name not in skip:  # Triton specialises integer arguments equal to 1
                signature[name], constexprs[name] = "constexpr", 1
            else:
                signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
                aligned += [name] if value % 16 == 0 and name not in skip else []
        else:
            signature[name] = "fp32"
    options = {k: v for k, v in kwargs.items() if k not in params}
    # aligned: the pointers and integers a launch specialises as divisible by 16, as Triton's launcher does; without
    # them the loads compile scalar and never become async copies
    return {"kernel": f"{fn.__module__}:{fn.__name__}", "signature": signature, "constexprs": constexprs,
            "options": options, "aligned": aligned}


def _drive_backend(hidden: int, heads: int, inter: int, dtype: Any, block_size: int) -> None:
    import torch

    from chattts_velocity.config import ModelConfig
    from chattts_velocity.engine.worker.backends.triton_backend import TritonBackend
    from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors
    from chattts_velocity.model import ChatTTSLlama, allocate_kv_pairs
    from chattts_velocity.model.kernels.triton import embedding, gemm
    config = ModelConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=heads,
                         num_key_value_heads=heads, max_position_embeddings=256)
    model = ChatTTSLlama(config).to(dtype).eval()
    pairs = allocate_kv_pairs(2, 9, block_size, heads, hidden // heads, dtype)
    backend = TritonBackend(model, PagedKV(pairs, block_size, 8, torch.device("cpu")), dtype, 4, 64)
    prefill = StepTensors.from_lists([5, 1], [5, 9], [[0, 1, 2], [3, 4, 5]], block_size, torch.device("cpu"))
    backend.run(torch.zeros(6, hidden, dtype=dtype), prefill)
    decode = StepTensors.from_lists([1, 1], [6, 10], [[0, 1, 2], [3, 4, 5]], block_size, torch.device("cpu"))
    backend.run(torch.zeros(2, hidden, dtype=dtype), decode)
    # a steady step's own launches (engine/worker/backends/step_graph.py): its inputs, the final norm into fp32
    for table_dtype in {dtype, torch.float32}:
        embedding.decode_inputs(torch.zeros(2, 4, dtype=torch.int64), torch.zeros(4 * 626, hidden, dtype=table_dtype),
                                decode.positions, decode.block_tables, block_size, dtype)
    backend.decode_step(torch.zeros(2, hidden, dtype=dtype), decode.positions, decode.row_metadata(),
                        out=torch.zeros(2, hidden))
    for vocab in (config.num_vq * config.num_audio_tokens, config.num_text_tokens):  # the heads on CUDA
        gemm.linear(torch.zeros(2, hidden), torch.zeros(vocab, hidden))


def compile_all(specs: list[Spec], targets: list[int]) -> list[dict[str, Any]]:
    """Compile each spec for each target (TRITON_INTERPRET unset); registers, shared and local memory per cubin."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    results = []
    for spec in specs:
        module, name = spec["kernel"].split(":")
        fn = getattr(importlib.import_module(module), name)
        for cc in targets:
            constexprs, options = _as_launched(spec, cc)
            row = {"kernel": name, "target": f"sm_{cc}", "constexprs": constexprs,
                   "pointers": {k: v for k, v in spec["signature"].items() if v.startswith("*")}}
            try:
                attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in spec["aligned"]}
                compiled = triton.compile(ASTSource(fn, spec["signature"], constexprs, attrs),
                                          target=GPUTarget("cuda", cc, 32), options=options)
                row |= _resources(compiled, cc)
            except Exception as exc:  # noqa: BLE001 -- a compile error is a result here
                row |= {"error": f"{type(exc).__name__}: {str(exc)[-800:]}"}
            results.append(row)
    return results


def _as_launched(spec: Spec, cc: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Constexprs and options of a recorded launch on compute capability cc: PDL on from sm_90 (gemm.pdl_available)."""
    constexprs, options = dict(spec["constexprs"]), dict(spec["options"])
    if "USE_PDL" in constexprs:
        constexprs["USE_PDL"] = cc >= 90
        options["launch_pdl"] = cc >= 90
    return constexprs, options


def _resources(compiled: Any, cc: int) -> dict[str, Any]:
    """Registers and shared memory of the cubin (cuobjdump); spills from ptxas -v over the same PTX."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin, ptx = Path(tmp) / "k.cubin", Path(tmp) / "k.ptx"
        cubin.write_bytes(compiled.asm["cubin"])
        ptx.write_text(compiled.asm["ptx"])
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        arch = f"sm_{cc}a" if cc >= 90 else f"sm_{cc}"
        fmad = [] if compiled.metadata.enable_fp_fusion else ["--fmad=false"]
        verbose = subprocess.run([get_ptxas(cc).path, "-v", f"--gpu-name={arch}", *fmad, str(ptx), "-o",
                                  str(Path(tmp) / "v.cubin")], capture_output=True, text=True)
    fields = dict(item.split(":", 1) for line in usage.splitlines() if "REG:" in line for item in line.split())
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", verbose.stderr + verbose.stdout)
    shared = max(int(compiled.metadata.shared), int(fields.get("SHARED", 0)))
    out = {"registers": int(fields["REG"]), "shared_bytes": shared, "local_bytes": int(fields.get("LOCAL", 0)),
           "stack_bytes": int(fields.get("STACK", 0)), "num_warps": compiled.metadata.num_warps,
           "spill_store_bytes": int(spills.group(1)) if spills else None,
           "spill_load_bytes": int(spills.group(2)) if spills else None}
    problems = []
    if spills is None:
        problems.append(f"ptxas -v reported no spill counts ({(verbose.stderr or verbose.stdout)[-300:]!r})")
    elif out["spill_store_bytes"] or out["spill_load_bytes"] or out["local_bytes"]:
        problems.append("register spills")
    if shared > TARGETS[cc]:
        problems.append(f"shared memory {shared} B above sm_{cc}'s {TARGETS[cc]} B")
    return out | instructions(compiled.asm["ptx"]) | ({"error": "; ".join(problems)} if problems else {})


def instructions(ptx: str) -> dict[str, Any]:
    """What the PTX shows of the GEMM path: the tensor-core instruction (`wgmma` on sm_90, `mma` the mma.sync of
    sm_80+, None: FMA products or no tl.dot), the async copies feeding it (`tma`: cp.async.bulk, `cp.async`, None)
    and, for kernels launched with PDL, whether an L2 prefetch precedes the wait for the previous kernel
    (`prefetch_before_wait`; None without a griddepcontrol.wait)."""
    mma = "wgmma" if re.search(r"\bwgmma\.mma_async", ptx) else "mma" if re.search(r"\bmma\.sync", ptx) else None
    copy = ("tma" if "cp.async.bulk" in ptx else "cp.async" if re.search(r"\bcp\.async\.c[ag]\b", ptx) else None)
    wait, prefetch = ptx.find("griddepcontrol.wait"), ptx.find("prefetch.global.L2")
    return {"mma": mma, "async_copy": copy,
            "prefetch_before_wait": None if wait < 0 else 0 <= prefetch < wait}


def source_key(targets: list[int]) -> str:
    """Hash of everything the results depend on: the kernels' and engine's sources, triton's version, targets."""
    import triton

    digest = hashlib.sha256(f"{triton.__version__} {targets} {MODELS} {DTYPES} {BLOCK_SIZES}".encode())
    for path in sorted([*KERNELS.glob("*.py"), ENGINE / "backends" / "triton_backend.py",
                        ENGINE / "backends" / "triton_layers.py", ENGINE / "sampling" / "device_sampler.py",
                        Path(__file__)]):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def run(targets: list[int], cache_dir: Path | None = None) -> dict[str, Any]:
    """Record (child process, interpreter) then compile (child process, no interpreter); cached by source_key."""
    key = source_key(targets)
    cached = cache_dir / f"{key}.json" if cache_dir else None
    if cached and cached.is_file():
        results: dict[str, Any] = json.loads(cached.read_text())
        return results
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    recorded = subprocess.run([sys.executable, "-m", MODULE, "--record"], capture_output=True, text=True,
                              env=env | {"TRITON_INTERPRET": "1"}, check=True, cwd=root)
    specs = json.loads(recorded.stdout.strip().splitlines()[-1])
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(specs, f)
    compiled = subprocess.run([sys.executable, "-m", MODULE, "--compile", f.name, "--targets",
                               ",".join(map(str, targets))], capture_output=True, text=True, env=env, check=True,
                              cwd=root)
    os.unlink(f.name)
    report = {"key": key, "targets": [f"sm_{cc}" for cc in targets], "kernels": len(specs),
              "results": json.loads(compiled.stdout.strip().splitlines()[-1])}
    if cached:
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(report, indent=1))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(map(str, TARGETS)), help="compute capabilities")
    parser.add_argument("--out", help="write the report here")
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    targets = [int(t) for t in args.targets.split(",")]
    if args.record:
        print(json.dumps(record()))
        return
    if args.compile:
        print(json.dumps(compile_all(json.loads(Path(args.compile).read_text()), targets)))
        return
    report = run(targets)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    failed = [r for r in report["results"] if "error" in r]
    print(f"{len(report['results'])} compilations, {len(failed)} failed")
    for row in failed:
        print(f"  {row['kernel']} {row['target']} {row['constexprs']}: {row['error']}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
