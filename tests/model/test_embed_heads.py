"""Embed.logits_rowwise on the CPU: the C++ head_linear of every ISA this CPU runs (and BLAS without the kernels)
gives a row the same bits whichever rows come with it, within float32 rounding of F.linear."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.model import Embed, kernels

H, V_AUDIO, V_TEXT, NUM_VQ = 96, 626, 500, 4
UNSUPPORTED = kernels.unsupported()
needs_kernels = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"CPU kernels unsupported here: {UNSUPPORTED}")


@pytest.fixture(scope="module")
def embed() -> Embed:
    torch.manual_seed(0)
    module = Embed(H, V_AUDIO, V_TEXT, NUM_VQ)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    return module.eval()


def _assert_rows_invariant(embed: Embed, name: str, hidden: torch.Tensor) -> torch.Tensor:
    """The logits of hidden [64, H] alone, in 3 rows and all together: the same bits; returns all of them."""
    whole = embed.logits_rowwise(hidden, name)
    for rows in (1, 3):
        for start in (0, 5, 61):
            part = embed.logits_rowwise(hidden[start:start + rows], name)
            assert torch.equal(part, whole[start:start + rows]), (name, rows, start)
    return whole


def _reference(embed: Embed, name: str, hidden: torch.Tensor) -> torch.Tensor:
    return embed.code_logits(hidden.double()).float() if name == "code" else embed.text_logits(hidden.double()).float()


@needs_kernels
@pytest.mark.parametrize("name", ["code", "text"])
def test_cpu_heads_are_row_invariant_and_within_float32_of_f_linear(embed: Embed, isa: str, name: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "active_ops", kernels.ops(isa))
    hidden = torch.randn(64, H) * 3
    logits = _assert_rows_invariant(embed, name, hidden)
    torch.testing.assert_close(logits, _reference(embed, name, hidden), rtol=1e-5, atol=1e-4)
    linear = embed.code_logits(hidden) if name == "code" else embed.text_logits(hidden)
    torch.testing.assert_close(logits, linear, rtol=1e-5, atol=1e-4)


@needs_kernels
def test_head_linear_sums_each_output_in_one_order_at_every_row_and_column_group(isa: str) -> None:
    """Odd row counts and output counts (every remainder of the kernel's groups) against float64."""
    op = kernels.ops(isa).head_linear
    weight = torch.randn(37, 48)
    x = torch.randn(11, 48)
    y = op(x, weight)
    torch.testing.assert_close(y.double(), x.double() @ weight.double().T, rtol=1e-5, atol=1e-5)
    for m in range(11):
        assert torch.equal(op(x[m:m + 1], weight), y[m:m + 1])
    assert torch.equal(op(x, weight[5:9]), y[:, 5:9])  # an output's bits do not depend on its neighbours either
    assert torch.equal(op(x.T.contiguous().T, weight), y)  # a strided x is read as its values


@needs_kernels
def test_head_linear_rejects_bad_inputs_clearly(isa: str) -> None:
    op = kernels.ops(isa).head_linear
    with pytest.raises(RuntimeError, match="multiple of 16"):
        op(torch.randn(2, 40), torch.randn(8, 40))
    with pytest.raises(RuntimeError, match="float32"):
        op(torch.randn(2, 48).bfloat16(), torch.randn(8, 48))


@pytest.mark.parametrize("name", ["code", "text"])
def test_blas_heads_without_the_kernels_are_row_invariant(embed: Embed, name: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "active_ops", None)
    hidden = torch.randn(64, H)
    logits = _assert_rows_invariant(embed, name, hidden)
    torch.testing.assert_close(logits, _reference(embed, name, hidden), rtol=1e-5, atol=1e-4)


def test_head_weights_follow_a_move_of_g_and_v(embed: Embed) -> None:
    module = Embed.from_state_dict({k: v.clone() for k, v in embed.state_dict().items()})
    hidden = torch.randn(2, H)
    before = module.logits_rowwise(hidden, "code")
    with torch.no_grad():  # new storage for g (what .to() or an assignment does): the stamp notices it
        g = module.head_code[2].parametrizations.weight.original0
        g.data = g.data * 2
    after = module.logits_rowwise(hidden, "code")
    torch.testing.assert_close(after[:, 2], 2 * before[:, 2], rtol=1e-5, atol=1e-5)
    assert torch.equal(after[:, :2], before[:, :2])
