"""The Decoder and Vocos on a CUDA device: Chat.load(device="cuda") puts them there in bf16, and decoding keeps every
tensor on the device until the final waveform (GPU tests, skipped without CUDA). The iSTFT that runs there (overlap-add,
no per-call NOLA check) is checked against torch.istft on CPU."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import Chat
from chattts_velocity.audio.vocos import ISTFT
from chattts_velocity.devtools.sync_detector import SyncDetector

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("frames", [2, 5, 40])
def test_the_overlap_add_istft_equals_torch_istft_without_syncing(frames: int) -> None:
    istft = ISTFT(1024, 256)
    gen = torch.Generator().manual_seed(frames)
    spec = torch.complex(torch.randn(2, 513, frames, generator=gen), torch.randn(2, 513, frames, generator=gen))
    expected = torch.istft(spec, 1024, 256, 1024, istft.window, center=True)
    with SyncDetector() as syncs:
        got = istft.overlap_add(spec)
    assert syncs.count == 0, syncs.ops
    assert got.shape == expected.shape == (2, (frames - 1) * 256)
    assert (got - expected).abs().max().item() <= 1e-6


def test_a_window_without_overlap_is_refused_at_load() -> None:
    istft = ISTFT(1024, 256)
    istft.window.zero_()
    with pytest.raises(ValueError, match="NOLA"):
        istft.check_window()


@pytest.mark.gpu
@needs_cuda
@torch.inference_mode()
def test_decoder_and_vocos_run_on_the_gpu_in_bf16_without_host_syncs(tiny_assets) -> None:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, device="cuda")
    assert chat.decode_dtype == torch.bfloat16
    for module in (chat.decoder, chat.dvae, chat.vocos):
        assert {p.device.type for p in module.parameters()} == {"cuda"}
    hidden = torch.randn(2, 2 * chat.decoder.decoder.idim, 12, device="cuda")  # [B, H, T]: a GPT stage's states
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=chat.decode_dtype):
            wavs = chat.vocos(chat.decoder(hidden).float())  # [2, (2*12 - 1) * 256]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert wavs.device.type == "cuda" and wavs.shape == (2, 23 * 256)
    assert bool(wavs.float().isfinite().all())
