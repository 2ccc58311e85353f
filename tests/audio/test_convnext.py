"""ConvNeXt block and conv stack against explicit F.* re-computations; the interleave layout."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chattts_velocity.audio.convnext import ConvNeXtBlock, ConvNeXtStack
from chattts_velocity.audio.dvae import interleave


def randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return module


def explicit_block(x: torch.Tensor, sd: dict[str, torch.Tensor], scale: str, dilation: int) -> torch.Tensor:
    k = sd["dwconv.weight"].shape[-1]
    y = F.conv1d(x, sd["dwconv.weight"], sd["dwconv.bias"], padding=dilation * (k // 2),
                 dilation=dilation, groups=x.shape[1])
    y = F.layer_norm(y.transpose(1, 2), (x.shape[1],), sd["norm.weight"], sd["norm.bias"], eps=1e-6)
    y = F.gelu(y @ sd["pwconv1.weight"].T + sd["pwconv1.bias"], approximate="none")
    y = (y @ sd["pwconv2.weight"].T + sd["pwconv2.bias"]) * sd[scale]
    return x + y.transpose(1, 2)


@pytest.mark.parametrize(("scale", "dilation"), [("weight", 2), ("gamma", 1)])
def test_block_matches_explicit_computation(scale: str, dilation: int) -> None:
    block = randomize(ConvNeXtBlock(16, 48, 7, dilation, scale), seed=0)
    assert set(block.state_dict()) == {scale, "dwconv.weight", "dwconv.bias", "norm.weight", "norm.bias",
                                       "pwconv1.weight", "pwconv1.bias", "pwconv2.weight", "pwconv2.bias"}
    x = torch.randn(2, 16, 23)
    out = block(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, explicit_block(x, block.state_dict(), scale, dilation))


def test_stack_matches_explicit_computation(decoder_sd: dict[str, torch.Tensor]) -> None:
    stack = ConvNeXtStack.sized_like(decoder_sd, "decoder.", "Decoder")
    sd = {k[len("decoder."):]: v for k, v in decoder_sd.items() if k.startswith("decoder.")}
    stack.load_state_dict(sd, strict=True)
    x = torch.randn(2, 32, 11)
    y = F.conv1d(x, sd["conv_in.0.weight"], sd["conv_in.0.bias"], padding=1)
    y = F.conv1d(F.gelu(y), sd["conv_in.2.weight"], sd["conv_in.2.bias"], padding=1)
    for j in range(2):
        block_sd = {k.split(".", 2)[2]: v for k, v in sd.items() if k.startswith(f"decoder_block.{j}.")}
        y = explicit_block(y, block_sd, "weight", dilation=2)
    expected = F.conv1d(y, sd["conv_out.weight"])
    torch.testing.assert_close(stack(x), expected)
    assert (stack.idim, stack.odim) == (32, 32)


def test_interleave_puts_first_half_on_even_frames() -> None:
    b, c, t = 2, 3, 4
    x = torch.zeros(b, 2 * c, t)
    for bi in range(b):
        for ch in range(2 * c):
            for ti in range(t):
                x[bi, ch, ti] = 1000 * bi + 10 * ch + ti  # unique, readable values
    out = interleave(x)
    assert out.shape == (b, c, 2 * t)
    for bi in range(b):
        for ch in range(c):
            for ti in range(t):
                assert out[bi, ch, 2 * ti] == 1000 * bi + 10 * ch + ti
                assert out[bi, ch, 2 * ti + 1] == 1000 * bi + 10 * (c + ch) + ti
