"""Chunk schedules of streamed audio: redundant work of the exact context, fixed window shapes, and the
one-batch-per-shape decode (what a GPU graphs) equal to the whole-clip decode."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from audio_state_dicts import decoder_shapes, vocos_shapes

from chattts_velocity.audio import DVAE, Decoder, StreamDecoder, Vocos, decode_hidden_batch, receptive_field
from chattts_velocity.audio.chunk_plan import ChunkSchedule, redundancy, stream_spans
from chattts_velocity.audio.window_runner import batch_bucket, runner_for
from chattts_velocity.speech import StreamOptions

STEPS_PER_S = 46.875
TOL = 1e-5  # the streaming tolerance (audio/streaming.py)


@pytest.fixture
def models(dvae_sd: dict, decoder_sd: dict, vocos_sd: dict) -> tuple[DVAE, Decoder, Vocos]:
    return DVAE.from_state_dict(dvae_sd), Decoder.from_state_dict(decoder_sd), Vocos.from_state_dict(vocos_sd)


def make_input(steps: int, seed: int) -> torch.Tensor:  # [T, 64] hidden states
    return torch.randn(steps, 64, generator=torch.Generator().manual_seed(seed))


def full_size_field():
    decoder = Decoder.sized_like({k: torch.empty(s) for k, s in decoder_shapes(384, 512, 128, 12).items()})
    vocos = Vocos.sized_like({k: torch.empty(s) for k, s in vocos_shapes(512, 1536, 8).items()})
    return receptive_field(decoder, vocos)


def speech_schedule(field) -> ChunkSchedule:
    o = StreamOptions()
    return ChunkSchedule(o.chunk_steps, field.lookahead_steps, o.first_chunk_steps, o.first_lookahead_steps,
                         o.max_chunk_steps)


@pytest.mark.parametrize("seconds", [10, 30, 60, 300])
def test_the_speech_default_redundancy_is_at_most_2x(seconds: int) -> None:
    field = full_size_field()
    steps = int(seconds * STEPS_PER_S)
    decoder, vocos = redundancy(speech_schedule(field), field.left_steps, field.mel_reach, steps)
    assert 1 < decoder <= 2 and 1 < vocos <= 2
    # the fixed 24-step chunks it replaces: Decoder (52 + 24 + 52) / 24 = 5.3x in the limit
    old = redundancy(ChunkSchedule(24, field.lookahead_steps), field.left_steps, field.mel_reach, steps)
    assert old[0] > 4 and old[0] > 2 * decoder


def test_redundancy_counts_every_decoded_step() -> None:
    # 100 steps, chunks of 10, 5 left and 5 ahead: windows [0,15) [5,25) ... each 20 wide but the first (15)
    spans = stream_spans(ChunkSchedule(10, 5), left=5, total_steps=100)
    assert [s.next for s in spans] == list(range(0, 100, 10))
    assert spans[-1].at_end and spans[-1].end == 100
    decoded = sum(s.end - s.first for s in spans)
    assert redundancy(ChunkSchedule(10, 5), 5, 0, 100)[0] == decoded / 100 == (15 + 8 * 20 + 15) / 100


def test_the_schedule_doubles_up_to_its_cap() -> None:
    plan = ChunkSchedule(24, 52, first_chunk_steps=4, first_lookahead_steps=24, max_chunk_steps=192)
    assert [plan.window(k) for k in range(6)] == [(4, 24), (24, 52), (48, 52), (96, 52), (192, 52), (192, 52)]
    assert ChunkSchedule(24, 52).window(7) == (24, 52)
    with pytest.raises(ValueError, match="max_chunk_steps"):
        ChunkSchedule(24, 52, max_chunk_steps=0)


def test_window_shapes_depend_on_the_index_only(models: tuple) -> None:
    _, decoder, vocos = models
    runner, shapes = runner_for(decoder, vocos), []
    runner.by_shape = True  # one batch per shape (on CPU all shapes would share one padded batch)
    for push in (1, 7, 50):
        sd = StreamDecoder(decoder, vocos, chunk_steps=4)
        sd.schedule = ChunkSchedule(4, sd.lookahead_steps, max_chunk_steps=32)
        x = make_input(300, seed=push)
        widths: list[int] = []
        hook = decoder.register_forward_pre_hook(lambda _m, args, w=widths: w.extend([args[0].shape[-1]]
                                                                                     * args[0].shape[0]))
        for t in range(0, 300, push):
            sd.push(x[t: t + push])
        hook.remove()
        shapes.append(widths)
    runner.by_shape = False
    assert shapes[0][: len(shapes[2])] == shapes[2][: len(shapes[0])]  # the same windows, whatever the pushes
    assert len(shapes[2]) >= 5 and len(set(shapes[0])) <= 6  # a handful of shapes: first windows, then the cap


def test_one_batch_per_shape_equals_the_whole_decode(models: tuple) -> None:
    """The grouping a GPU uses (each shape its own batch; on CUDA a graph replay), run eagerly on the CPU."""
    _, decoder, vocos = models
    runner = runner_for(decoder, vocos)
    lengths, pushes = [40, 97, 5, 70], [1, 3, 2, 6]
    xs = [make_input(t, seed=30 + t) for t in lengths]
    streams = [StreamDecoder(decoder, vocos, chunk_steps=3) for _ in lengths]
    for s in streams:
        s.schedule = ChunkSchedule(3, s.lookahead_steps, first_chunk_steps=2, max_chunk_steps=12)
    runner.by_shape = True
    try:
        outs: list[list[np.ndarray]] = [[] for _ in lengths]
        for t in range(max(lengths)):
            rows = [x[t * p: (t + 1) * p] for x, p in zip(xs, pushes, strict=True)]
            for o, wav in zip(outs, StreamDecoder.push_many(streams, rows), strict=True):
                o.append(wav)
        for o, wav in zip(outs, StreamDecoder.flush_many(streams), strict=True):
            o.append(wav)
    finally:
        runner.by_shape = False
    for o, x in zip(outs, xs, strict=True):
        np.testing.assert_allclose(np.concatenate(o), decode_hidden_batch(decoder, vocos, [x])[0], rtol=0, atol=TOL)


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("autocast", [False, True])
def test_cuda_graph_windows_equal_the_whole_decode(models: tuple, autocast: bool) -> None:
    """On CUDA same-shape windows replay captured graphs on the audio's own stream; the clip is still the whole one."""
    _, decoder, vocos = (m.cuda() for m in models)
    xs = [make_input(300, seed=9 + k).cuda() for k in range(3)]
    streams = [StreamDecoder(decoder, vocos, chunk_steps=4) for _ in xs]
    for s in streams:
        s.schedule = ChunkSchedule(4, s.lookahead_steps, first_chunk_steps=2, max_chunk_steps=32)
    outs: list[list[np.ndarray]] = [[] for _ in xs]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        for t in range(0, 300, 5):
            for o, wav in zip(outs, StreamDecoder.push_many(streams, [x[t: t + 5] for x in xs]), strict=True):
                o.append(wav)
        for o, wav in zip(outs, StreamDecoder.flush_many(streams), strict=True):
            o.append(wav)
        wholes = decode_hidden_batch(decoder, vocos, xs, torch.bfloat16 if autocast else None)
    runner = runner_for(decoder, vocos)
    assert runner.stream is not None and runner.by_shape
    assert sum(g is not None for g in runner.graphs.values()) >= 3  # the first windows' shapes, then the capped one
    tolerance = 5e-2 if autocast else 2e-3  # bf16; TF32 convolutions in float32
    for o, whole in zip(outs, wholes, strict=True):
        np.testing.assert_allclose(np.concatenate(o), whole, rtol=0, atol=tolerance * np.abs(whole).max())
