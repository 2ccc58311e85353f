"""Host syncs in an engine step: SyncDetector (devtools/sync_detector.py) on CPU, torch's sync debug mode on a GPU.

A decode step may read one thing back from the device: the sampled ids. Everything else (embedding, metadata,
attention, sampling) must be launched without the host waiting.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

from chattts_velocity import Chat, InferCodeParams, load_pretrained
from chattts_velocity.devtools.sync_detector import SyncDetector
from chattts_velocity.model import Embed
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.text import split_pieces

REASON = available()
needs_triton = pytest.mark.skipif(REASON is not None, reason=f"Triton kernels unavailable: {REASON}")
CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
TEXTS = ["Hello world.", "Short", "A somewhat longer English sentence here."]


def _boolean_index_embed(embed: Embed, ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
    # the former Embed.embed: rows picked by boolean masks (nonzero on CUDA: a sync per mask)
    out = torch.zeros(ids.shape[0], embed.hidden_size)
    out[text_mask] = embed.embed_text(ids[text_mask][:, 0])
    out[~text_mask] = embed.embed_codes(ids[~text_mask])
    return out


def test_the_detector_sees_boolean_indexing_item_and_copies_back() -> None:
    embed = Embed(16, 10, 20, 4).eval()
    ids, mask = torch.randint(0, 10, (6, 4)), torch.tensor([True, False, False, True, False, False])
    with SyncDetector() as syncs:
        expected = _boolean_index_embed(embed, ids, mask)
    assert syncs.count >= 2, syncs.ops  # the former embed would fail a "<= 1 per decode step" check on its own
    with SyncDetector() as syncs:
        got = embed.embed(ids, mask)
    assert syncs.count == 0, syncs.ops
    assert torch.equal(got, expected)
    with SyncDetector() as syncs:
        ids.sum().item()
        mask.nonzero()
        ids.cpu()
        torch.repeat_interleave(torch.arange(2), torch.tensor([1, 2]))
        torch.repeat_interleave(torch.arange(2), torch.tensor([1, 2]), output_size=3)  # no sync
    assert dict(syncs.ops) == {"aten._local_scalar_dense": 1, "aten.nonzero": 1, "Tensor.cpu": 1,
                               "aten.repeat_interleave": 1}


def _decode_steps(engine, chat: Chat, steps: int) -> list[int]:
    params = InferCodeParams(temperature=0.3, max_new_token=12, min_new_token=12, show_tqdm=False)
    requests = chat.speech_requests(split_pieces(TEXTS, split=False), params)
    for i, (prompt, sampling) in enumerate(zip(requests.prompts, requests.sampling, strict=True)):
        engine.add_request(f"r{i}", prompt, sampling)
    engine.step()  # the prefill
    engine.step()  # a first decode step
    counts = []
    for _ in range(steps):
        with SyncDetector() as syncs:
            engine.step()
        counts.append(syncs.count)
    return counts


@pytest.mark.triton
@needs_triton
def test_a_triton_decode_step_syncs_at_most_once(tiny_assets, triton_device) -> None:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    engine = load_pretrained(tiny_assets, is_vllm=True, device=triton_device, backend="triton", max_num_seqs=4).engine
    assert engine.runner.backend.name == "triton"
    assert all(count <= 1 for count in _decode_steps(engine, chat, 3))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA, with TRITON_INTERPRET unset")
def test_a_gpu_decode_step_syncs_only_for_the_sampled_ids(tiny_assets) -> None:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    engine = load_pretrained(tiny_assets, is_vllm=True, device="cuda", backend="triton", max_num_seqs=4).engine
    assert all(count <= 1 for count in _decode_steps(engine, chat, 2))
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, syncs  # the copy of the sampled ids [B, 4]
