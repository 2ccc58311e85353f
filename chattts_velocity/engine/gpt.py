"""Choose the GPT stage: the plain transformers path (oracle) or the velocity engine."""
from __future__ import annotations

from pathlib import Path

from ..assets import AssetPaths


def load_pretrained(
    assets: AssetPaths | str | Path,
    is_vllm: bool = False,
    device: str = "cpu",
    dtype: str = "float32",
    compile: bool = False,
    **engine_kwargs,
):
    """Load the GPT + Embed from an asset folder.

    is_vllm=False -> `PlainGPT`: transformers `LlamaModel` and upstream's batched loop (the baseline).
    is_vllm=True  -> `LLM`: the velocity engine (paged KV cache, continuous batching, per-request
    sampling). Both answer `generate(prompts, params, progress=..., should_stop=...)`.
    """
    paths = assets if isinstance(assets, AssetPaths) else AssetPaths.from_root(assets)
    if is_vllm:
        from .llm import LLM

        return LLM.from_assets(paths, device=device, dtype=dtype, compile=compile, **engine_kwargs)
    if dtype != "float32" or engine_kwargs:
        extra = sorted(engine_kwargs) + ([f"dtype={dtype}"] if dtype != "float32" else [])
        raise ValueError(f"load_pretrained: {extra} only apply to the velocity engine (is_vllm=True)")
    from .plain import PlainGPT

    return PlainGPT.load(paths.gpt_dir, paths.embed, device=device)
