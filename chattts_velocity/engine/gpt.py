"""The GPT stage behind one interface: the plain transformers path (oracle) or the velocity engine.

`load_pretrained(is_vllm=...)` is the only place that chooses; everything after it talks to a `GPTBackend`.
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from chattts_velocity.assets import AssetPaths
from chattts_velocity.config import ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.engine.loading.host import decide_here
from chattts_velocity.precision import Precision
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams

StopFlag = Callable[[], bool] | None
Deltas = list[tuple[int, GenerationOutput]]  # (prompt index, its new rows) for every prompt that moved


class GPTBackend(Protocol):
    """What the pipeline needs from a GPT stage. `params` is one SamplingParams for all prompts or one per prompt."""

    @property
    def config(self) -> ModelConfig:
        """The GPT's dimensions (hidden_size is a speaker vector's width)."""

    @property
    def engine(self) -> LLMEngine | None:
        """The velocity engine, for callers that step it themselves; None on the plain path."""

    def generate(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams], progress: bool = True,
                 should_stop: StopFlag = None, max_batch: int | None = None) -> list[GenerationOutput]:
        """Whole outputs in input order. max_batch bounds a padded batch (plain path); the engine batches
        continuously and needs no bound."""

    def generate_iter(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams],
                      progress: bool = True, should_stop: StopFlag = None) -> Iterator[tuple[int, GenerationOutput]]:
        """(index, whole output) as each prompt finishes."""

    def stream(self, prompts: list[Prompt], params: list[SamplingParams], chunk_steps: int,
               should_stop: StopFlag = None, due_rows: Collection[int] = ()) -> Iterator[Deltas]:
        """New rows as they are generated: at most one delta per prompt per yield, each of at most chunk_steps rows;
        the last delta of each prompt has finished=True. due_rows: row counts at which the consumer wants a prompt's
        rows without waiting for the chunk (its windows' ends). Closing the iterator early aborts what is still
        running."""

    def shutdown(self) -> None:
        """Release threads and memory; the backend is unusable afterwards."""


def load_pretrained(
    assets: AssetPaths | str | Path,
    is_vllm: bool = False,
    device: str | torch.device | None = "cpu",
    dtype: str = "float32",
    compile: bool = False,
    kv_cache_dtype: str = "auto",
    precision: Precision | None = None,
    **engine_kwargs: Any,
) -> GPTBackend:
    """Load the GPT + Embed from an asset folder.

    is_vllm=False -> `PlainGPT`: transformers `LlamaModel` and upstream's batched loop (the baseline; float32 only).
    is_vllm=True  -> `LLM`: the velocity engine (paged KV cache, continuous batching, per-request sampling).
    `precision` (decided by the caller, its device included) is used as is; else device, dtype ("auto": the
    fastest here) and kv_cache_dtype are decided into one here (engine/loading/host.py). compile and engine_kwargs
    are EngineConfig fields (velocity engine only).
    """
    paths = assets if isinstance(assets, AssetPaths) else AssetPaths.from_root(assets)
    choices = {"device": device != "cpu", "dtype": dtype != "float32", "kv_cache_dtype": kv_cache_dtype != "auto"}
    if precision is not None and any(choices.values()):
        raise ValueError(f"precision: decided already; {[k for k, given in choices.items() if given]} cannot "
                         "change it")
    if is_vllm:
        from chattts_velocity.engine.llm import LLM

        precision = precision or decide_here(dtype, kv_cache_dtype, device=device,
                                             backend=engine_kwargs.get("backend", "auto"))
        return LLM.from_assets(paths, precision=precision, compile=compile, **engine_kwargs)
    if precision is not None:  # its choices, as named
        dtype, kv_cache_dtype = precision.dtype, "int8" if precision.kv_cache == torch.int8 else "auto"
    if dtype != "float32" or kv_cache_dtype != "auto" or engine_kwargs:
        extra = (sorted(engine_kwargs) + ([f"dtype={dtype}"] if dtype != "float32" else [])
                 + ([f"kv_cache_dtype={kv_cache_dtype}"] if kv_cache_dtype != "auto" else []))
        raise ValueError(f"load_pretrained: {extra} only apply to the velocity engine (is_vllm=True)")
    from chattts_velocity.engine.plain.loop import PlainGPT

    return PlainGPT.load(paths.gpt_dir, paths.embed, precision or decide_here(device=device))
