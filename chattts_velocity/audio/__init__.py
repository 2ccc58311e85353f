"""Audio stage (language-blind): GPT hidden states or codes -> mel -> 24 kHz waveform, and wav -> codes."""
from __future__ import annotations

from chattts_velocity.audio.convnext import ConvNeXtBlock, ConvNeXtStack
from chattts_velocity.audio.decode import cast_for_autocast, decode_codes_batch, decode_hidden_batch, pad_batch
from chattts_velocity.audio.dvae import DVAE, Decoder, interleave
from chattts_velocity.audio.encode import open_encoder, wav_bytes, write_wav
from chattts_velocity.audio.gfsq import GFSQ, FSQVariant
from chattts_velocity.audio.loading import load_safetensors, load_strict
from chattts_velocity.audio.mel import MelSpectrogram, MelSpectrogramFeatures, htk_mel_filterbank
from chattts_velocity.audio.streaming import StreamDecoder, receptive_field
from chattts_velocity.audio.timestamps import Spoken, Timestamp, piece_timestamps
from chattts_velocity.audio.vocos import Vocos
from chattts_velocity.audio.wav import HOP_LENGTH, SAMPLE_RATE, float_to_int16, load_clip, samples_for_steps

__all__ = [
    "DVAE", "GFSQ", "HOP_LENGTH", "SAMPLE_RATE", "ConvNeXtBlock", "ConvNeXtStack", "Decoder", "FSQVariant",
    "MelSpectrogram", "MelSpectrogramFeatures", "StreamDecoder", "Vocos", "cast_for_autocast",
    "decode_codes_batch", "decode_hidden_batch", "float_to_int16", "htk_mel_filterbank", "interleave", "load_clip",
    "load_safetensors", "load_strict", "open_encoder",
    "pad_batch", "piece_timestamps", "receptive_field", "samples_for_steps", "Spoken", "Timestamp", "wav_bytes",
    "write_wav",
]
