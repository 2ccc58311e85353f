"""Text stage: speaker strings. Speaker vectors and audio-prompt codes <-> upstream's text encodings.

Strings are bit-compatible with ChatTTS 0.2.5: base16384(raw LZMA2(little-endian payload)), so strings move
between the two packages.
"""
from __future__ import annotations

import functools
import lzma
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pybase16384 as b14
import torch
import torch.nn.functional as F

from chattts_velocity.config import ModelConfig

SPK_STAT_PATH = Path(__file__).parent / "res" / "spk_stat.npy"
VOICE_SEED_MAX = 2**32 - 1  # seeds that name a random voice (server voices, the web UI's dice)
SPEAKER_PREFIX = "蘁淰"  # b14 of the LZMA2 chunk header every speaker string starts with
_LZMA_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
MAX_SPEAKER_CHARS = 4096  # a 768-wide fp16 speaker is ~900 characters
MAX_SPEAKER_VALUES = 4096  # the widest speaker decoded (the official model's is 768)
MAX_CLIP_CHARS = 65536  # a clip code of MAX_CLIP_FRAMES compresses to well under this
CLIP_ROWS = 4  # num_vq: one row of codes per DVAE codebook
MAX_CLIP_FRAMES = ModelConfig.max_position_embeddings  # a longer clip could never fit in a prompt
MAX_CLIP_CODE = 625  # the GPT has 626 audio tokens (the DVAE's 625 codes and EOS); larger ids index past it
_SPK_HINT = f"(expected a string from sample_random_speaker(), starting with {SPEAKER_PREFIX})"
_SMP_HINT = "(expected a string from Chat.sample_audio_speaker() or encode_prompt())"
# base16384 alphabet: 14-bit payload characters, plus one optional trailing marker U+3D01..U+3D06
# giving the byte count of a partial final 7-byte group.
_B14_FIRST, _B14_LAST = 0x4E00, 0x4E00 + (1 << 14) - 1
_B14_MARKERS = range(0x3D01, 0x3D07)


def _compress(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)


def _unpack(s: object, field: str, hint: str, max_chars: int, max_bytes: int | Callable[[bytes], int], *,
            header: int = 0) -> tuple[bytes, bytes]:
    """b14-decode `s`, split off `header` raw bytes, LZMA2-decompress the rest -> (header, payload).

    Bounded before any work: at most `max_chars` characters in, at most `max_bytes` decompressed bytes out (a
    callable gets the header and gives the exact size it announces); a string that would decode to more is refused
    as soon as the decompressor has produced one byte too many, so a compression bomb costs microseconds.
    """
    if not isinstance(s, str) or not s:
        raise ValueError(f"{field}: got {type(s).__name__} {s!r:.40}, not a non-empty string {hint}")
    if len(s) > max_chars:
        raise ValueError(f"{field}: {len(s)} characters is over the limit of {max_chars} {hint}")
    body = s[:-1] if ord(s[-1]) in _B14_MARKERS else s
    if not all(_B14_FIRST <= ord(c) <= _B14_LAST for c in body):
        raise ValueError(f"{field}: {s[:12]!r}... contains characters outside base16384 {hint}")
    raw = b14.decode_from_string(s)
    if len(raw) <= header:
        raise ValueError(f"{field}: the string is too short ({len(raw)} bytes decoded) {hint}")
    limit = max_bytes(raw[:header]) if callable(max_bytes) else max_bytes
    return raw[:header], _decompress(raw[header:], limit, field, hint)


def _decompress(data: bytes, limit: int, field: str, hint: str) -> bytes:
    """Raw LZMA2 -> at most `limit` bytes; a stream that is longer, cut short or damaged is a ValueError."""
    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    try:
        payload = decompressor.decompress(data, max_length=limit + 1)
    except lzma.LZMAError as e:
        raise ValueError(f"{field}: the string is corrupt ({e}) {hint}") from None
    if len(payload) > limit:
        raise ValueError(f"{field}: decodes to more than {limit} bytes, the most a valid one holds {hint}")
    if not decompressor.eof:
        raise ValueError(f"{field}: the string is corrupt (the compressed data ends early) {hint}")
    return payload


def encode_spk_emb(x: torch.Tensor) -> str:
    """Speaker vector [D] (any float dtype; stored as float16) -> upstream speaker string."""
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.is_floating_point():
        raise ValueError(f"spk_emb: expected a 1-D float tensor, got {_describe(x)}")
    arr = x.detach().to(device="cpu", dtype=torch.float16).numpy().astype("<f2")
    encoded: str = b14.encode_to_string(_compress(arr.tobytes()))  # pybase16384 is untyped
    return encoded


def decode_spk_emb(s: str, field: str = "speaker") -> torch.Tensor:
    """Upstream speaker string -> float16 [D]. Malformed or oversized strings raise ValueError naming `field`."""
    try:
        values = _speaker_values(s)
    except ValueError as exc:
        raise ValueError(f"{field}: {str(exc).split(': ', 1)[-1]}") from None
    return torch.from_numpy(values.copy())  # [D]


@functools.lru_cache(maxsize=256)
def _speaker_values(s: str) -> np.ndarray:
    """A speaker string's values, decoded once per distinct string whatever field names it (read-only; callers
    copy)."""
    _, raw = _unpack(s, "speaker", _SPK_HINT, MAX_SPEAKER_CHARS, 2 * MAX_SPEAKER_VALUES)
    if not raw or len(raw) % 2:
        raise ValueError(f"speaker: decoded to {len(raw)} bytes, not a float16 vector {_SPK_HINT}")
    values = np.frombuffer(raw, dtype="<f2").astype(np.float16)
    values.flags.writeable = False
    return values


# a speaker is normalised in float16: a (nearly) zero vector has no direction (NaN audio), and fp16 ends at 65504
SPEAKER_NORM_RANGE = (1e-2, 6e4)


def speaker_tensor(spk_emb: str | torch.Tensor | None, hidden_size: int,
                   field: str = "spk_emb") -> torch.Tensor | None:
    """InferCodeParams.spk_emb (a speaker string or a 1-D tensor) -> [hidden_size], checked against the model
    (pipeline code reaches it through TextFrontEnd.speaker); a ValueError names `field`."""
    if spk_emb is None:
        return None
    if isinstance(spk_emb, str):
        spk_emb = decode_spk_emb(spk_emb, field)
    elif not (isinstance(spk_emb, torch.Tensor) and spk_emb.dim() == 1):
        raise ValueError(f"{field}: expected a speaker string from sample_random_speaker() or a 1-D tensor")
    if spk_emb.shape[0] != hidden_size:
        raise ValueError(f"{field}: this speaker has {spk_emb.shape[0]} values but the model needs "
                         f"{hidden_size}; sample it with this model's sample_random_speaker()")
    return check_speaker_values(spk_emb, field)


def check_speaker_values(x: torch.Tensor, field: str = "spk_emb") -> torch.Tensor:
    """A speaker vector the model can use: finite, and not (nearly) all zeros (its direction is what counts)."""
    values = x.detach().float()
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"{field}: holds NaN or infinite values; use a speaker from sample_random_speaker()")
    norm = float(values.norm())
    if not SPEAKER_NORM_RANGE[0] <= norm <= SPEAKER_NORM_RANGE[1]:
        raise ValueError(f"{field}: its norm {norm:.3g} is outside the sane range {SPEAKER_NORM_RANGE} (random "
                         "speakers of the official model have norms around 130); use a speaker from "
                         "sample_random_speaker()")
    return x


def speaker_stats(dim: int = 768, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(std, mean), each float16 [dim]: upstream's spk_stat, truncated to the first `dim` entries.

    The official statistics are 768 wide. A smaller `dim` (tiny test checkpoints) takes the first
    `dim` entries of std and of mean; this has no upstream counterpart.
    """
    stat = torch.from_numpy(np.load(SPK_STAT_PATH).astype(np.float16))  # [2 * 768]: std then mean
    std, mean = stat.chunk(2)
    if not 1 <= dim <= std.numel():
        raise ValueError(f"dim: must be in 1..{std.numel()} (the width of spk_stat), got {dim}")
    return std[:dim].to(device), mean[:dim].to(device)


def sample_random_speaker(dim: int = 768, device: torch.device | str = "cpu", seed: int | None = None) -> str:
    """A random voice as an upstream speaker string, drawn from the global torch RNG (seed None) or from a
    generator of its own seeded with `seed`: the same draw as after torch.manual_seed(seed), without touching
    the global RNG that other threads draw from.

    Same draw as upstream: fp16 randn(dim) on `device`, then `x * std + mean` as two rounded fp16
    ops, so under torch.manual_seed(s) the CPU string equals upstream's. See speaker_stats for
    dim != 768.
    """
    std, mean = speaker_stats(dim, device)
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(dim, device=device, dtype=torch.float16, generator=generator)  # [dim]
    x.mul_(std).add_(mean)  # NOTE: not addcmul, whose single rounding differs from upstream
    return encode_spk_emb(x)


def normalize_spk_emb(x: torch.Tensor) -> torch.Tensor:
    """Speaker vector [D] -> unit-norm float32 [D], as upstream injects it (the model saw unit-norm speakers).

    The norm is taken on the CPU in the vector's own dtype (fp16 for decoded strings), i.e.
    fp16(x / fp16(||x||)), and only then upcast; an fp32 computation is not bit-identical.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.is_floating_point():
        raise ValueError(f"spk_emb: expected a 1-D float tensor or a speaker string, got {_describe(x)}")
    return F.normalize(x.detach().cpu(), p=2.0, dim=0, eps=1e-12).to(torch.float32)


def encode_prompt(codes: torch.Tensor) -> str:
    """Audio-prompt codes [num_vq, T] (integers 0..65535) -> upstream spk_smp string."""
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.is_floating_point():
        raise ValueError(f"spk_smp: expected a 2-D integer tensor [num_vq, T], got {_describe(codes)}")
    if max(codes.shape) > 0xFFFF or (codes.numel() and (codes.min() < 0 or codes.max() > 0xFFFF)):
        raise ValueError("spk_smp: codes and both dimensions must fit in uint16 (0..65535)")
    arr = codes.detach().cpu().numpy().astype("<u2")  # row-major [num_vq, T]
    encoded: str = b14.encode_to_string(struct.pack("<HH", *arr.shape) + _compress(arr.tobytes()))
    return encoded


def decode_prompt(s: str) -> torch.Tensor:
    """Upstream spk_smp string -> int32 [4, T], T <= MAX_CLIP_FRAMES. Malformed or oversized strings raise ValueError;
    the shape in the header is checked before anything is decompressed."""
    return torch.from_numpy(_clip_codes(s).copy())  # [num_vq, T]


@functools.lru_cache(maxsize=64)
def _clip_codes(s: str) -> np.ndarray:
    """A clip code's codes, decoded once per distinct string (read-only; callers copy)."""
    head, raw = _unpack(s, "spk_smp", _SMP_HINT, MAX_CLIP_CHARS, _clip_bytes, header=4)
    rows, cols = struct.unpack("<HH", head)
    if len(raw) != 2 * rows * cols:
        raise ValueError(f"spk_smp: header says [{rows}, {cols}] but {len(raw)} bytes follow {_SMP_HINT}")
    codes = np.frombuffer(raw, dtype="<u2").astype(np.int32).reshape(rows, cols)
    if int(codes.max()) > MAX_CLIP_CODE:
        raise ValueError(f"spk_smp: holds the code {int(codes.max())}; clip codes are 0..{MAX_CLIP_CODE} {_SMP_HINT}")
    codes.flags.writeable = False
    return codes


def _clip_bytes(head: bytes) -> int:
    """The payload size a clip code's header announces, once its shape is known to be one a model can use."""
    rows, cols = (int(n) for n in struct.unpack("<HH", head))
    if rows != CLIP_ROWS or not 1 <= cols <= MAX_CLIP_FRAMES:
        raise ValueError(f"spk_smp: the codes are [{rows}, {cols}]; a clip code is [{CLIP_ROWS}, 1..{MAX_CLIP_FRAMES}] "
                         f"{_SMP_HINT}")
    return 2 * rows * cols


@contextmanager
def seed_context(seed: int) -> Iterator[None]:
    """Seed every torch device with `seed`; on exit restore the CPU RNG state only (as upstream)."""
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
