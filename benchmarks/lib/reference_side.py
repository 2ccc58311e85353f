"""Benchmark, reference side: time chattts 0.2.5 inside its own process (runs in the reference venv).

Usage: ``python reference_side.py REQUEST.json OUT.json`` (runs.run_reference writes the request).
Request: {"asset_root", "steps", "threads", "speaker", "decode": bool, "batches": [[text, ...], ...]}.
Out: one record per batch with gpt_seconds, decode_seconds, cpu_seconds, peak_rss_mb, ttft ([]: not
observable from outside the reference's generate loop). Never imported by chattts_velocity.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import torch
from probe import peak_rss_mb, process_cpu_seconds  # the sibling lib/probe.py: this file runs as a script

FILES = {"vocos_ckpt_path": "Vocos.safetensors", "dvae_ckpt_path": "DVAE.safetensors", "gpt_ckpt_path": "gpt",
         "embed_path": "Embed.safetensors", "decoder_ckpt_path": "Decoder.safetensors", "tokenizer_path": "tokenizer"}


def load_chat(root: Path):
    import ChatTTS

    asset = root / "asset" if (root / "asset" / "gpt").is_dir() else root
    chat = ChatTTS.Chat(logging.getLogger("reference_side"))
    if not chat._load(device=torch.device("cpu"), compile=False, **{k: str(asset / v) for k, v in FILES.items()}):
        raise RuntimeError(f"reference Chat._load failed for {asset}")
    return chat


def time_batch(chat, texts: list[str], request: dict) -> dict:
    params = chat.InferCodeParams(spk_emb=request["speaker"], max_new_token=request["steps"],
                                  min_new_token=request["steps"], show_tqdm=False)
    cpu, start = process_cpu_seconds(), time.perf_counter()
    result = next(chat._infer_code(list(texts), False, chat.device, True, params))
    gpt = time.perf_counter() - start
    decode = None
    if request["decode"]:
        start = time.perf_counter()
        chat._decode_to_wavs(list(result.hiddens), True)
        decode = time.perf_counter() - start
    return {"concurrency": len(texts), "gpt_seconds": gpt, "decode_seconds": decode, "ttft": [],
            "cpu_seconds": process_cpu_seconds() - cpu, "peak_rss_mb": peak_rss_mb()}


def main(request_path: str, out_path: str) -> None:
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    torch.set_num_threads(int(request["threads"]))
    chat = load_chat(Path(request["asset_root"]))
    with torch.inference_mode():
        results = [time_batch(chat, texts, request) for texts in request["batches"]]
    Path(out_path).write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:3])
