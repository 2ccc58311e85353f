"""Text stage (language-aware): normalise and split text, build GPT prompts, encode speakers.

In: user text, speaker strings, voice-sample codes. Out: schema.Prompt for the engine.
"""
from chattts_velocity.schema import pad_left
from chattts_velocity.text.controls import CONTROL_LEVELS, DEFAULT_LEVELS, check_controls, control_token
from chattts_velocity.text.normalizer import Normalizer, detect_language, split_text
from chattts_velocity.text.pieces import (
    EmptyText,
    check_texts,
    empty_text,
    normalized_pieces,
    split_pieces,
    spoken_pieces,
)
from chattts_velocity.text.speaker import (
    decode_prompt,
    decode_spk_emb,
    encode_prompt,
    encode_spk_emb,
    normalize_spk_emb,
    sample_random_speaker,
    seed_context,
    speaker_tensor,
)
from chattts_velocity.text.tokenizer import Tokenizer
from chattts_velocity.text.voices import Voice, VoiceLibrary, voice_params

__all__ = [
    "CONTROL_LEVELS",
    "DEFAULT_LEVELS",
    "EmptyText",
    "Normalizer",
    "Tokenizer",
    "Voice",
    "VoiceLibrary",
    "check_controls",
    "check_texts",
    "control_token",
    "decode_prompt",
    "decode_spk_emb",
    "detect_language",
    "empty_text",
    "encode_prompt",
    "encode_spk_emb",
    "normalize_spk_emb",
    "normalized_pieces",
    "pad_left",
    "sample_random_speaker",
    "seed_context",
    "speaker_tensor",
    "split_pieces",
    "split_text",
    "spoken_pieces",
    "voice_params",
]
