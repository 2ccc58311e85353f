"""Engine stage: the GPT's weights in the engine's precision — loaded in its weight dtype, linears packed for it.

In: the asset paths and EngineConfig (device, precision). Out: the paged ChatTTSLlama and the Embed, ready to run.
"""
from __future__ import annotations

from chattts_velocity.assets import AssetPaths
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.model import ChatTTSLlama, Embed, load_embed, load_gpt
from chattts_velocity.precision import Precision


def load_weights(paths: AssetPaths, config: ModelConfig, engine_config: EngineConfig) -> tuple[ChatTTSLlama, Embed]:
    """The GPT in the precision's weight dtype (not packed yet: pack_for does it) and the Embed in float32."""
    model = load_gpt(paths.gpt_dir, config, dtype=engine_config.precision.weights, device=engine_config.device)
    return model, load_embed(paths.embed, device=engine_config.device)


def pack_for(model: ChatTTSLlama, precision: Precision) -> None:
    """Add the packed linears the precision runs (none for float32, nor for bf16 / fp16 on CUDA)."""
    if precision.packing is not None:
        model.pack_linears(precision.packing)
