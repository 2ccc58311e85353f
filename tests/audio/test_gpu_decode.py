"""The Decoder and Vocos on a CUDA device: Chat.load(device="cuda") puts them there in bf16, and decoding keeps every
tensor on the device until the final waveform. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import Chat

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


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
