"""llama.cpp against our engine on ChatTTS's GPT shape, in one run (bench_cpu.py's target 0).

Builds a random-weight Llama GGUF of exactly our GPT's shape (read from the model's gpt/config.json: hidden 768,
20 layers, 12 heads, intermediate 3072; one output head of num_vq x num_audio_tokens = 2504 rows, where ours are
four 626-row heads) with the `gguf` package in BF16, then Q8_0 and Q4_0 with llama.cpp's own quantizer. It times
llama-cpp-python's batch API (2 threads, 22-token prompts, greedy, prefill excluded) at each concurrency and our
engine through the public API on the same shape and sizes (bf16 vs BF16, int8 vs Q8_0, int4 vs Q4_0), and writes
the ratios to
results/llamacpp_<hostkind>.json. Needs the `bench` extra, built with native CPU flags:

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install -e '.[bench]'
    python -m benchmarks.bench_llamacpp --model .pytest-assets/full          # ~5 minutes
    python -m benchmarks.bench_llamacpp --model .pytest-assets/tiny --quick  # smoke run

GGUF files go to ~/.cache/chattts_velocity/llamacpp (never into the repository).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

CACHE = Path.home() / ".cache" / "chattts_velocity" / "llamacpp"
PROMPT_TOKENS = 22
WARMUP_STEPS = 2  # decode steps before the clock starts (first-batch allocations), like our warm-up
PAIRS = {"bfloat16": "BF16", "int8": "Q8_0", "int4": "Q4_0"}  # our precision -> the llama.cpp type it meets


def shape_of(model: str) -> dict:
    """Our GPT's dimensions from the asset folder's gpt/config.json."""
    from chattts_velocity.assets import AssetPaths
    from chattts_velocity.config import ModelConfig
    from chattts_velocity.demo import ensure_model

    config = ModelConfig.from_json(AssetPaths.from_root(ensure_model(model)[0]).gpt_config)
    return {"hidden": config.hidden_size, "layers": config.num_hidden_layers, "heads": config.num_attention_heads,
            "intermediate": config.intermediate_size, "vocab": config.num_vq * config.num_audio_tokens,
            "rope_theta": config.rope_theta, "eps": config.rms_norm_eps}


def gguf_paths(shape: dict) -> dict[str, Path]:
    """BF16, Q8_0 and Q4_0 files of this shape, built once and cached."""
    folder = CACHE / "-".join(str(shape[k]) for k in ("hidden", "layers", "heads", "intermediate", "vocab"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"model-{name}.gguf" for name in ("BF16", "Q8_0", "Q4_0")}
    if not paths["BF16"].is_file():
        write_bf16(paths["BF16"], shape)
    for name in ("Q8_0", "Q4_0"):
        if not paths[name].is_file():
            quantize(paths["BF16"], paths[name], name)
    return paths


def write_bf16(path: Path, shape: dict) -> None:
    import gguf

    h, f, v = shape["hidden"], shape["intermediate"], shape["vocab"]
    writer = gguf.GGUFWriter(str(path) + ".part", "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(h)
    writer.add_block_count(shape["layers"])
    writer.add_feed_forward_length(f)
    writer.add_head_count(shape["heads"])
    writer.add_head_count_kv(shape["heads"])
    writer.add_rope_dimension_count(h // shape["heads"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_layer_norm_rms_eps(shape["eps"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    writer.add_vocab_size(v)
    _add_vocab(writer, v)
    rng = np.random.default_rng(0)
    for name, rows, cols in _tensors(shape):
        if cols is None:
            writer.add_tensor(name, np.ones(rows, dtype=np.float32))
        else:
            weights = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02)
            bf16 = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.BF16)
            writer.add_tensor(name, bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(path) + ".part").rename(path)


def _tensors(shape: dict) -> list[tuple[str, int, int | None]]:
    """(GGUF name, rows, columns or None for a norm vector) in llama.cpp's Llama layout."""
    h, f, v = shape["hidden"], shape["intermediate"], shape["vocab"]
    out = [("token_embd.weight", v, h), ("output_norm.weight", h, None), ("output.weight", v, h)]
    for i in range(shape["layers"]):
        out += [(f"blk.{i}.attn_norm.weight", h, None), (f"blk.{i}.ffn_norm.weight", h, None)]
        out += [(f"blk.{i}.attn_{p}.weight", h, h) for p in ("q", "k", "v", "output")]
        out += [(f"blk.{i}.ffn_gate.weight", f, h), (f"blk.{i}.ffn_up.weight", f, h),
                (f"blk.{i}.ffn_down.weight", h, f)]
    return out


def _add_vocab(writer, size: int) -> None:
    """A SentencePiece-style vocabulary of `size` tokens (the batch API feeds ids; nothing is tokenised)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, byte
    tokens += [f"\u2581t{i}" for i in range(size - len(tokens))]
    types += [1] * (size - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * size)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def quantize(source: Path, target: Path, name: str) -> None:
    import llama_cpp

    llama_cpp.llama_log_set(_quiet_callback(), None)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
    params.nthread = 2
    part = target.with_suffix(".part")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(part).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed for {name}")
    part.rename(target)


def llama_rate(path: Path, n: int, steps: int, threads: int = 2) -> float:
    """Tokens/s of n sequences decoded together for `steps` greedy steps after a 22-token prefill (excluded)."""
    import llama_cpp as L

    L.llama_log_set(_quiet_callback(), None)
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    cparams = L.llama_context_default_params()
    cparams.n_ctx = n * (PROMPT_TOKENS + steps + 16)
    cparams.n_batch = cparams.n_ubatch = max(512, n * PROMPT_TOKENS)
    cparams.n_seq_max, cparams.n_threads, cparams.n_threads_batch = n, threads, threads
    ctx = L.llama_init_from_model(model, cparams)
    batch = L.llama_batch_init(n * PROMPT_TOKENS, 0, 1)
    try:
        vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        rng = np.random.default_rng(n)
        tokens = rng.integers(3, vocab, size=(n, PROMPT_TOKENS))
        last = PROMPT_TOKENS - 1
        _fill(batch, [(s, p, int(tokens[s, p]), p == last) for s in range(n) for p in range(PROMPT_TOKENS)])
        _decode(L, ctx, batch)
        nxt = _greedy(L, ctx, n, vocab)
        for step in range(WARMUP_STEPS + steps):
            if step == WARMUP_STEPS:
                start = time.perf_counter()
            _fill(batch, [(s, PROMPT_TOKENS + step, int(nxt[s]), True) for s in range(n)])
            _decode(L, ctx, batch)
            nxt = _greedy(L, ctx, n, vocab)
        return n * steps / (time.perf_counter() - start)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


def check_decodes(path: Path, threads: int) -> None:
    """llama.cpp's first decodes of `path` in a child process, so that a crash inside llama.cpp (0.3.36 built with
    GGML_NATIVE on a Sapphire Rapids guest segfaults in its AMX int8 path) is a RuntimeError here, not the end of
    the benchmark and of everything it measured before."""
    code = (f"from pathlib import Path; "
            f"from benchmarks.bench_llamacpp import llama_rate; llama_rate(Path({str(path)!r}), 1, 4, {threads})")
    path_first = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))  # a --target build kept
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": path_first})
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp fails on its first decode of {path.name} (exit {done.returncode}: "
                           f"{done.stderr.strip()[-300:] or 'no message'}); try a build without -march=native, "
                           "e.g. CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_BF16=ON\"")


@functools.cache  # the ctypes callback must outlive every llama.cpp call
def _quiet_callback():
    import llama_cpp

    return llama_cpp.llama_log_callback(lambda level, text, data: None)


def _fill(batch, rows: list[tuple[int, int, int, bool]]) -> None:
    """rows: (sequence, position, token, wants logits)."""
    batch.n_tokens = len(rows)
    for i, (seq, pos, token, logits) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, logits
        batch.seq_id[i][0] = seq


def _decode(L, ctx, batch) -> None:
    if L.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")


def _greedy(L, ctx, n: int, vocab: int) -> np.ndarray:
    logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n, vocab))
    return logits.argmax(axis=1)


def compare(model: str, sizes: list[int], steps: int, threads: int = 2, chats: dict | None = None,
            repeats: int = 1) -> dict:
    """Every llama.cpp type against our precision at the same bytes per weight, at every size (best of
    `repeats`), and ours / llama.cpp per pair. The two sides of a cell run back to back, cell after cell, so a swing
    of the host's memory bandwidth (shared hosts swing by 2x within minutes) hits both alike. `chats`: loaded Chat
    objects by dtype (loaded here if absent)."""
    from benchmarks.lib.public import decode_rate, load_chat

    paths = gguf_paths(shape_of(model))
    for path in paths.values():
        check_decodes(path, threads)
    loaded = {dtype: (chats or {}).get(dtype) or load_chat(model, dtype, threads) for dtype in PAIRS}
    for chat in loaded.values():
        decode_rate(chat, 1, 8)  # warm-up: kernel build and first-step costs
    llama: dict[str, dict[int, float]] = {name: {} for name in PAIRS.values()}
    ours: dict[str, dict[int, float]] = {dtype: {} for dtype in PAIRS}
    for _ in range(repeats):
        for dtype, name in PAIRS.items():
            for n in sizes:
                llama[name][n] = max(llama[name].get(n, 0.0), llama_rate(paths[name], n, steps, threads))
                ours[dtype][n] = max(ours[dtype].get(n, 0.0), decode_rate(loaded[dtype], n, steps))
    ratios = {f"{dtype}@{n} / {PAIRS[dtype]}@{n}": ours[dtype][n] / llama[PAIRS[dtype]][n]
              for dtype in PAIRS for n in sizes}
    return {"shape": shape_of(model), "steps": steps, "prompt_tokens": PROMPT_TOKENS, "threads": threads,
            "repeats": repeats, "llama_cpp_tokens_per_s": llama, "ours_steps_per_s": ours, "ratios": ratios,
            "llama_cpp_version": _version()}


def _version() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}; {llama_cpp.llama_print_system_info().decode().strip()}"


def main(argv: list[str] | None = None) -> None:
    from benchmarks.lib.probe import cpu_identity

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo", help="asset folder (random full-size weights are fine)")
    parser.add_argument("--sizes", default="1,16,32,64")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per cell")
    parser.add_argument("--quick", action="store_true", help="sizes 1,4, 16 steps, one repeat")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--name", help="the results' host kind (default: this CPU's, e.g. spr-amx); name an "
                                       "emulation, e.g. x86-avx2-emulated for an AVX2-only llama.cpp build run "
                                       "against CHATTTS_VELOCITY_CPU_KERNELS=avx2")
    args = parser.parse_args(argv)
    sizes, steps = ([1, 4], 16) if args.quick else ([int(s) for s in args.sizes.split(",")], args.steps)
    cpu = cpu_identity()
    report = {"cpu": cpu, **compare(args.model, sizes, steps, repeats=1 if args.quick else args.repeats)}
    if args.name:
        report["kernels_switch"] = os.environ.get("CHATTTS_VELOCITY_CPU_KERNELS", "1")
    path = Path(args.out) / f"llamacpp_{args.name or cpu['host_kind']}.json"
    path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps(report["ratios"], indent=1), f"\nwritten to {path}")


if __name__ == "__main__":
    main()
