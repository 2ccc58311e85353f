"""Configuration: model dimensions (read from gpt/config.json) and engine knobs."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from chattts_velocity.precision import Precision


@dataclass(frozen=True)
class ModelConfig:
    """GPT dimensions. Always read from the checkpoint's gpt/config.json, never assumed."""

    hidden_size: int = 768
    intermediate_size: int = 3072
    num_hidden_layers: int = 20
    num_attention_heads: int = 12
    num_key_value_heads: int = 12
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    num_audio_tokens: int = 626  # codes 0..624 plus the audio EOS 625
    num_text_tokens: int = 21178
    num_vq: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def audio_eos_id(self) -> int:
        return self.num_audio_tokens - 1

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"gpt config: {path} does not exist (expected asset/gpt/config.json)")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"gpt config: {path} is not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"gpt config: {path} must hold a JSON object, got a {type(raw).__name__}")
        values: dict[str, Any] = {f.name: _checked(path, f.name, raw[f.name], str(f.type))  # f.type: "int" | "float"
                                  for f in fields(cls) if f.name in raw}
        cfg = cls(**values)
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ValueError(f"gpt config: {path}: hidden_size ({cfg.hidden_size}) is not a multiple of "
                             f"num_attention_heads ({cfg.num_attention_heads})")
        if cfg.num_key_value_heads != cfg.num_attention_heads:
            raise ValueError(
                f"gpt config: {path}: num_key_value_heads ({cfg.num_key_value_heads}) != num_attention_heads "
                f"({cfg.num_attention_heads}); ChatTTS checkpoints have no grouped-query attention"
            )
        return cfg


def _checked(path: Path, name: str, value: object, kind: str) -> int | float:
    """A config.json number of the field's kind (ints > 0, floats finite and > 0), else a ValueError naming both."""
    number = (int,) if kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, number) or not 0 < value < float("inf"):
        want = "an integer" if kind == "int" else "a number"
        raise ValueError(f"gpt config: {path}: {name} must be {want} > 0, got {value!r}")
    return value


BACKENDS = ("auto", "torch", "cpu", "triton")
PRECISION_OPTIONS = ("dtype", "kv_cache_dtype", "device")  # from_kwargs' strings, decided into EngineConfig.precision


@dataclass
class EngineConfig:
    """Knobs of the velocity engine. Build with EngineConfig.from_kwargs(**user_kwargs)."""

    block_size: int = 16  # positions per KV block (one position = one step of 4 codes)
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of RAM/VRAM; None -> 1 GiB on CPU
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 2048  # token budget of one step (chunked prefill beyond it)
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    scheduling: str = "fcfs"  # or "priority"
    # the device and every dtype (precision.py), decided once by the caller; the default: exact float32 on the CPU
    precision: Precision = field(default_factory=Precision.decide)
    backend: str = "auto"  # decode backend: "auto", "torch", "cpu" or "triton" (engine/worker/backends/select.py)
    compile: bool = False  # torch.compile the decode step (torch backend)
    # launch steady decode step n+1 before reading step n's tokens (engine/worker/overlap.py); None: where steady steps
    # run as one CUDA graph (the triton backend on CUDA). Read once, by the model runner.
    overlap: bool | None = None
    num_threads: int | None = None
    seed: int = 0  # seeds the generator that picks seeds for unseeded requests

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.scheduling not in ("fcfs", "priority"):
            raise ValueError(f"scheduling: must be 'fcfs' or 'priority', got {self.scheduling!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {self.backend!r}")

    @property
    def device(self) -> torch.device:
        """The precision's device: where the weights, the KV pool and every step live."""
        return self.precision.device

    @classmethod
    def from_kwargs(cls, precision: Precision | None = None, **kwargs: Any) -> EngineConfig:
        """The config of these options. The engine's public edge: `precision` (a decided Precision), or its choices
        as strings (dtype, kv_cache_dtype, device; "auto" dtype is resolved where the kernels are known:
        engine/loading/host.decide_here, load_pretrained), decided here with the backend."""
        names = {f.name for f in fields(cls) if f.init} - {"precision"}
        unknown = set(kwargs) - names - set(PRECISION_OPTIONS)
        if unknown:
            known = sorted(names | {"precision", *PRECISION_OPTIONS})
            raise ValueError(f"EngineConfig: unknown option(s) {sorted(unknown)}; known: {known}")
        choices = {k: kwargs.pop(k) for k in PRECISION_OPTIONS if k in kwargs}
        if precision is not None and choices:
            raise ValueError(f"precision: decided already; {sorted(choices)} cannot change it")
        if precision is None:
            precision = Precision.decide(choices.get("dtype", "float32"), choices.get("kv_cache_dtype", "auto"),
                                         device=choices.get("device", "cpu"), backend=kwargs.get("backend", "auto"))
        return cls(**kwargs, precision=precision)
