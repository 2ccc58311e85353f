"""Audio stage: waveform helpers (the sample rate, float32 [-1, 1] numpy -> int16 PCM, mono checks, clip loading);
encoding to WAV and the other formats is audio/encode.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SAMPLE_RATE = 24000  # Hz, of every waveform the package makes or takes (Vocos' rate)
HOP_LENGTH = 256  # samples per mel frame; one GPT step gives 2 mel frames
# libsndfile's frame count for a header that holds no length (a streamed FLAC's STREAMINFO says 0, "unknown"):
# soundfile then fails to read the file to its end ("array is too big", or a failed seek past the last sample)
UNKNOWN_FRAMES = 2**63 - 1
NO_LENGTH_HINT = ("its header holds no length (a streamed FLAC), which libsndfile (soundfile) cannot read; convert "
                  "it first (`ffmpeg -i in.flac out.flac`) or ask the server without `stream`")


def samples_for_steps(num_steps: int, hop_length: int = HOP_LENGTH) -> int:
    """Samples Vocos yields for num_steps GPT steps: (2T - 1) * hop, 0 for T = 0."""
    return max(2 * num_steps - 1, 0) * hop_length


def float_to_int16(wav: np.ndarray) -> np.ndarray:
    """Clip to [-1, 1] and scale by 32767 (no peak normalisation, so silence stays silent)."""
    x = np.nan_to_num(np.asarray(wav, dtype=np.float32), nan=0.0)
    scaled: np.ndarray = np.rint(np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)
    return scaled


def as_mono(wav: np.ndarray) -> np.ndarray:
    """[N] or [1, N] / [N, 1] -> [N]; a ValueError naming `wav` for anything else."""
    x = np.asarray(wav)
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"wav: expected a 1-D mono waveform, got shape {x.shape}")
    return x


def load_clip(clip: np.ndarray | torch.Tensor | str | Path, sample_rate: int = SAMPLE_RATE,
              expected_rate: int = SAMPLE_RATE) -> torch.Tensor:  # -> [N] float32
    """A reference clip as a 1-D float32 tensor: an array/tensor at sample_rate, or an audio file
    (channels averaged to mono, its own rate). Integer PCM is scaled to [-1, 1]. No resampling."""
    if isinstance(clip, (str, Path)):
        import soundfile as sf

        if not Path(clip).is_file():
            raise ValueError(f"wav: audio file {str(clip)!r} does not exist")
        with sf.SoundFile(str(clip)) as f:
            if f.frames == UNKNOWN_FRAMES:
                raise ValueError(f"wav: {str(clip)!r}: {NO_LENGTH_HINT}")
            data, sample_rate = f.read(dtype="float32", always_2d=True), f.samplerate  # [N, channels]
        clip = data.mean(axis=1)
    if sample_rate != expected_rate:
        raise ValueError(f"sample_rate: the clip is {sample_rate} Hz; resample it to {expected_rate} Hz first")
    x = torch.as_tensor(np.asarray(clip) if not isinstance(clip, torch.Tensor) else clip)
    if x.dim() != 1:
        raise ValueError(f"wav: expected a 1-D mono clip, got shape {tuple(x.shape)}; mix down to mono first")
    if x.dtype in (torch.int16, torch.int32):
        x = x.double() / float(-torch.iinfo(x.dtype).min)
    elif not x.is_floating_point():
        raise ValueError(f"wav: expected float, int16 or int32 samples, got {x.dtype}")
    return x.float()
