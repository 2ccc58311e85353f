"""Streaming decode: pushes + flush == whole-clip decode, exact length, bounded windows, latency, batching."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from audio_state_dicts import decoder_shapes, vocos_shapes

from chattts_velocity.audio import DVAE, Decoder, Vocos, decode_codes_batch, decode_hidden_batch
from chattts_velocity.audio.streaming import StreamDecoder, receptive_field

TOL = 1e-5  # documented max abs difference to the whole-clip decode (measured <= 4e-7 here)
HOP = 256


@pytest.fixture
def models(dvae_sd: dict, decoder_sd: dict, vocos_sd: dict) -> tuple[DVAE, Decoder, Vocos]:
    return DVAE.from_state_dict(dvae_sd), Decoder.from_state_dict(decoder_sd), Vocos.from_state_dict(vocos_sd)


def make_input(use_decoder: bool, steps: int, seed: int) -> torch.Tensor:  # [T, 64] hidden or [T, 4] codes
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, 64, generator=g) if use_decoder else torch.randint(0, 625, (steps, 4), generator=g)


def whole(models: tuple[DVAE, Decoder, Vocos], use_decoder: bool, x: torch.Tensor) -> np.ndarray:
    dvae, decoder, vocos = models
    if use_decoder:
        return decode_hidden_batch(decoder, vocos, [x])[0]
    return decode_codes_batch(dvae, vocos, [x])[0]


def stream(models: tuple[DVAE, Decoder, Vocos], use_decoder: bool, x: torch.Tensor, push: int,
           **kwargs: int) -> list[np.ndarray]:
    """Every push() output followed by the flush() output."""
    dvae, decoder, vocos = models
    sd = StreamDecoder(decoder if use_decoder else dvae, vocos, **kwargs)
    outs = [sd.push(x[i: i + push]) for i in range(0, x.shape[0], push)]
    return outs + [sd.flush()]


def join_errors(parts: list[np.ndarray], ref: np.ndarray) -> tuple[float, float]:
    """(max abs error within one hop of a chunk join, max abs error elsewhere)."""
    err = np.abs(np.concatenate(parts) - ref)
    near = np.zeros(len(ref), dtype=bool)
    for j in np.cumsum([len(p) for p in parts])[:-1]:
        near[max(j - HOP, 0): j + HOP] = True
    return float(err[near].max(initial=0.0)), float(err[~near].max(initial=0.0))


@pytest.mark.parametrize("use_decoder", [True, False])
@pytest.mark.parametrize("push,chunk", [(1, 1), (7, 7), (24, 24), (1, 24)])
@pytest.mark.parametrize("steps", [1, 5, 60, 200])
def test_stream_equals_whole_decode(models: tuple, use_decoder: bool, push: int, chunk: int, steps: int) -> None:
    x = make_input(use_decoder, steps, seed=steps + push)
    ref = whole(models, use_decoder, x)
    parts = stream(models, use_decoder, x, push, chunk_steps=chunk)
    got = np.concatenate(parts)
    assert got.dtype == np.float32 and all(p.dtype == np.float32 for p in parts)
    assert len(got) == (2 * steps - 1) * HOP
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)
    assert np.abs(ref).max() > 1e-2  # the comparison is not between two silences


@pytest.mark.parametrize("use_decoder", [True, False])
def test_joins_have_no_clicks(models: tuple, use_decoder: bool) -> None:
    x = make_input(use_decoder, 150, seed=7)
    ref = whole(models, use_decoder, x)
    parts = stream(models, use_decoder, x, push=5, chunk_steps=10)
    assert sum(len(p) > 0 for p in parts) >= 10
    join, interior = join_errors(parts, ref)
    assert join <= interior + 1e-6 and join <= TOL
    jumps = np.diff(np.concatenate(parts)) - np.diff(ref)  # a click is a jump the whole decode lacks
    assert np.abs(jumps).max() <= 2 * TOL
    # without context the same chunking clicks: the test above can fail
    naive_join, _ = join_errors(stream(models, use_decoder, x, 5, chunk_steps=10, left_context_steps=0,
                                       lookahead_steps=1), ref)
    assert naive_join > 1e-3


def test_receptive_field_is_the_formula(models: tuple) -> None:
    dvae, decoder, vocos = models
    n_layer, voc_layers = 2, 2  # tiny config
    for mel_model in (decoder, dvae):
        field = receptive_field(mel_model, vocos)
        assert (field.mel_radius, field.voc_radius, field.istft_half) == (1 + 1 + 6 * n_layer + 1,
                                                                           3 + 3 * voc_layers, 1024 // 512)
    full_decoder = Decoder.sized_like({k: torch.empty(s) for k, s in decoder_shapes(384, 512, 128, 12).items()})
    full_vocos = Vocos.sized_like({k: torch.empty(s) for k, s in vocos_shapes(512, 1536, 8).items()})
    full = receptive_field(full_decoder, full_vocos)  # full-size shapes, unloaded weights
    assert (full.mel_radius, full.voc_radius, full.reach) == (75, 27, 103)
    assert (full.left_steps, full.lookahead_steps) == (52, 52)


@pytest.mark.parametrize("less", ["left_context_steps", "lookahead_steps"])
def test_exact_context_is_minimal(models: tuple, less: str) -> None:
    """One step less context than the computed field shows up as an error far above float noise."""
    x = make_input(True, 60, seed=3)
    ref = whole(models, True, x)
    exact = np.abs(np.concatenate(stream(models, True, x, push=7, chunk_steps=7)) - ref).max()
    field = receptive_field(models[1], models[2])
    short = {"left_context_steps": field.left_steps, "lookahead_steps": field.lookahead_steps}
    short[less] -= 1
    cut = np.abs(np.concatenate(stream(models, True, x, push=7, chunk_steps=7, **short)) - ref).max()
    assert exact <= TOL and cut > 10 * exact + 5e-6


def test_decode_cost_per_push_is_bounded(models: tuple) -> None:
    _, decoder, vocos = models
    frames: list[int] = []  # decoder-input steps of every Decoder call
    hook = decoder.register_forward_pre_hook(lambda _m, args: frames.append(args[0].shape[-1]))
    sd = StreamDecoder(decoder, vocos, chunk_steps=24)
    x = make_input(True, 600, seed=11)
    per_push = []
    for t in range(600):
        before = len(frames)
        sd.push(x[t: t + 1])
        per_push.append(sum(frames[before:]))
    hook.remove()
    bound = sd.left_context_steps + sd.chunk_steps + sd.lookahead_steps
    assert max(per_push) == bound  # steady-state window, reached early and never exceeded
    assert max(per_push[:100]) == max(per_push[500:])
    assert sum(per_push) <= 600 * bound / sd.chunk_steps  # linear in the stream, not quadratic


def test_first_chunk_latency(models: tuple) -> None:
    _, decoder, vocos = models
    sd = StreamDecoder(decoder, vocos, chunk_steps=7)
    x = make_input(True, 100, seed=5)
    sizes = [len(sd.push(x[t: t + 1])) for t in range(100)]
    first = next(t for t, n in enumerate(sizes) if n) + 1  # steps pushed when audio first appears
    assert first == sd.chunk_steps + sd.lookahead_steps
    assert sizes[first - 1] == 2 * sd.chunk_steps * HOP
    assert sd.emitted_samples == sum(sizes)
    tail = sd.flush()
    assert sd.emitted_samples == sum(sizes) + len(tail) == (2 * 100 - 1) * HOP


def test_empty_stream_and_empty_push(models: tuple) -> None:
    dvae, decoder, vocos = models
    sd = StreamDecoder(decoder, vocos)
    empty = sd.push(torch.zeros(0, 64))
    assert empty.shape == (0,) and empty.dtype == np.float32
    out = sd.flush()
    assert out.shape == (0,) and out.dtype == np.float32
    assert StreamDecoder(dvae, vocos).flush().shape == (0,)


def _stream(models: tuple, xs: list[torch.Tensor], pushes: list[int]) -> list[np.ndarray]:
    """Each x streamed in pushes of its own size, all streams through push_many / flush_many together."""
    _, decoder, vocos = models
    streams = [StreamDecoder(decoder, vocos, chunk_steps=6) for _ in xs]
    outs: list[list[np.ndarray]] = [[] for _ in xs]
    for start in range(max(len(x) for x in xs)):
        rows = [x[start * p: (start + 1) * p] for x, p in zip(xs, pushes, strict=True)]
        for o, wav in zip(outs, StreamDecoder.push_many(streams, rows), strict=True):
            o.append(wav)
    for o, wav in zip(outs, StreamDecoder.flush_many(streams), strict=True):
        o.append(wav)
    return [np.concatenate(o) for o in outs]


def test_push_many_gives_each_stream_the_bits_it_gives_alone(models: tuple) -> None:
    _, decoder, _ = models
    lengths, pushes = [40, 97, 5, 70], [1, 3, 2, 6]
    xs = [make_input(True, t, seed=20 + t) for t in lengths]
    calls: list[int] = []
    hook = decoder.register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[0]))
    together = _stream(models, xs, pushes)
    hook.remove()
    assert set(calls) == {1}  # every window in a pass of its own
    for i, (got, x) in enumerate(zip(together, xs, strict=True)):
        np.testing.assert_allclose(got, whole(models, True, x), rtol=0, atol=TOL)
        np.testing.assert_array_equal(got, _stream(models, [x], [pushes[i]])[0])


def test_bad_input_raises(models: tuple) -> None:
    dvae, decoder, vocos = models
    with pytest.raises(ValueError, match="mel_model"):
        StreamDecoder(vocos, vocos)
    for name in ("chunk_steps", "lookahead_steps"):
        with pytest.raises(ValueError, match=name):
            StreamDecoder(decoder, vocos, **{name: 0})
    sd = StreamDecoder(decoder, vocos)
    with pytest.raises(ValueError, match=r"hidden: expected \[n, 64\]"):
        sd.push(torch.randn(3, 32))
    with pytest.raises(ValueError, match="float hidden"):
        sd.push(torch.zeros(3, 64, dtype=torch.long))
    codes = StreamDecoder(dvae, vocos)
    with pytest.raises(ValueError, match="integer codes"):
        codes.push(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="audio EOS"):
        codes.push(torch.full((3, 4), 625))
    with pytest.raises(ValueError, match="same decoder"):
        StreamDecoder.push_many([sd, codes], [torch.randn(1, 64), torch.zeros(1, 4, dtype=torch.long)])
    assert sd.total_steps == 0 and codes.total_steps == 0  # rejected input leaves no trace
    sd.flush()
    with pytest.raises(ValueError, match="flush"):
        sd.push(torch.randn(1, 64))
