"""chattts_velocity: ChatTTS text-to-speech behind a fast vLLM-style engine.

    from chattts_velocity import Chat
    from chattts_velocity.demo import demo_model_dir   # `chattts-velocity demo` writes random weights there
    chat = Chat(); chat.load(source="custom", custom_path=demo_model_dir())
    wavs = chat.infer(["Hello there."], use_vllm=True)   # one float32 24 kHz waveform per text
"""
from .chat import Chat
from .config import EngineConfig, ModelConfig
from .engine.gpt import load_pretrained
from .params import InferCodeParams, RefineTextParams
from .schema import GenerationOutput, Prompt, SamplingParams

__all__ = [
    "Chat",
    "EngineConfig",
    "GenerationOutput",
    "InferCodeParams",
    "ModelConfig",
    "Prompt",
    "RefineTextParams",
    "SamplingParams",
    "load_pretrained",
]
__version__ = "0.1.0"
