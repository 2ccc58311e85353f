"""The triton decode backend (engine/worker/backends/triton_backend.py) and its CUDA graphs (cuda_graphs.py).

`triton` tests run the whole engine through the Triton kernels (on CPU: Triton's interpreter, so few steps on the
tiny model) and compare it with the plain path; the graph ladder and padding are pure functions, tested here on
CPU; `gpu` tests (graph replay == eager, no host sync in a step) need a CUDA device and skip without one.
"""
from __future__ import annotations

import os

import pytest
import torch
from backend_lists import decode

from chattts_velocity import Chat, InferCodeParams, load_pretrained
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.worker.backends import triton_backend
from chattts_velocity.engine.worker.backends.cuda_graphs import DecodeGraphs, bucket, graph_batch_sizes
from chattts_velocity.engine.worker.backends.select import select_backend
from chattts_velocity.engine.worker.backends.torch_backend import TorchBackend
from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors, padded_decode
from chattts_velocity.model import (
    ChatTTSLlama,
    allocate_kv_pairs,
    kv_cache_bytes_per_block,
)
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.text import split_pieces

REASON = available()
needs_triton = pytest.mark.skipif(REASON is not None, reason=f"Triton kernels unavailable: {REASON}")
CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA, with TRITON_INTERPRET unset")
TEXTS = ["Hello world.", "你好，今天天气很好，我们出去玩吧。", "Short", "A somewhat longer English sentence here."]
HIDDEN, HEADS, BLOCK, NUM_BLOCKS = 64, 4, 4, 32
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=HEADS,
                     num_key_value_heads=HEADS, max_position_embeddings=256)


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    return chat


def _near_greedy(steps: int, **kw) -> InferCodeParams:
    return InferCodeParams(temperature=1e-6, max_new_token=steps, min_new_token=steps, show_tqdm=False, **kw)


# ---- the whole engine on the tiny checkpoint (Triton's interpreter here) -------------------------


@pytest.mark.triton
@needs_triton
def test_engine_on_triton_equals_the_plain_path_mixed_lengths_with_speaker(chat: Chat, tiny_assets,
                                                                          triton_device) -> None:
    torch.manual_seed(0)
    sampling = _near_greedy(10, spk_emb=chat.sample_random_speaker())
    requests = chat.speech_requests(split_pieces(TEXTS, split=False), sampling)
    plain = chat.gpt(False).generate(requests.prompts, requests.sampling, False, max_batch=len(TEXTS))
    llm = load_pretrained(tiny_assets, is_vllm=True, device=triton_device, backend="triton")
    fast = llm.generate(requests.prompts, requests.sampling, False)
    assert llm.engine.metrics()["backend"] == "triton"
    assert len({len(p.input_ids) for p in requests.prompts}) == len(TEXTS)  # ragged contexts in every decode step
    for a, b in zip(plain, fast, strict=True):
        assert len(b.token_ids) == 10 and torch.equal(a.token_ids.cpu(), b.token_ids.cpu())
        assert (a.hidden.cpu() - b.hidden.cpu()).abs().max().item() <= 1e-4


@pytest.mark.triton
@needs_triton
def test_preemption_and_recompute_on_triton_give_the_same_codes(chat: Chat, tiny_assets, triton_device) -> None:
    prompts = [chat.tokenizer.code_prompt(f"Sentence number {i} with a few words.", None, None, "[speed_5]", None)
               for i in range(4)]
    params = [InferCodeParams(manual_seed=i, max_new_token=10, min_new_token=10, show_tqdm=False)
              .to_sampling_params("code", 625, return_hidden=True) for i in range(4)]
    # both engines sample on the device (DeviceSampler): its Philox stream is not the CPU sampler's
    free = load_pretrained(tiny_assets, is_vllm=True, device=triton_device, backend="triton").generate(
        prompts, params, progress=False)
    cfg = ModelConfig.from_json(f"{tiny_assets}/asset/gpt/config.json")
    per_block = kv_cache_bytes_per_block(cfg.num_hidden_layers, 4, cfg.num_attention_heads, cfg.head_dim)
    # 4 sequences of ~30 positions need ~32 blocks of 4: a pool of 14 forces preemption and recompute
    tight = load_pretrained(tiny_assets, is_vllm=True, device=triton_device, backend="triton", block_size=4,
                            max_model_len=56, kv_cache_memory=14 * per_block)
    constrained = tight.generate(prompts, params, progress=False)
    assert tight.engine.scheduler.num_preemptions > 0
    for a, b in zip(free, constrained, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert (a.hidden - b.hidden).abs().max().item() <= 1e-4
    assert tight.engine.block_manager.num_used_blocks == 0


@pytest.mark.triton
@needs_triton
def test_a_requests_codes_on_triton_do_not_depend_on_its_batch(chat: Chat, tiny_assets, triton_device) -> None:
    prompts = [chat.tokenizer.code_prompt(text, None, None, "[speed_5]", None) for text in TEXTS[:3]]
    params = [InferCodeParams(manual_seed=i, max_new_token=6, min_new_token=6, show_tqdm=False)
              .to_sampling_params("code", 625, return_hidden=False) for i in range(3)]  # temperature 0.3, top_p, top_k
    llm = load_pretrained(tiny_assets, is_vllm=True, device=triton_device, backend="triton")
    assert type(llm.engine.runner.sampler).__name__ == "DeviceSampler"
    batched = llm.generate(prompts, params, progress=False)
    alone = llm.generate(prompts[1:2], params[1:2], progress=False)
    assert torch.equal(alone[0].token_ids, batched[1].token_ids)
    assert not torch.equal(batched[0].token_ids, batched[2].token_ids)


@pytest.mark.slow  # several seconds: the default suite stays within its time
@needs_triton
def test_chat_load_passes_the_backend_to_the_engine(tiny_assets) -> None:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True, backend="triton")
    assert chat.engine().metrics()["backend"] == "triton"


# ---- choosing the backend ---------------------------------------------------------------------------


def _model() -> ChatTTSLlama:
    gen = torch.Generator().manual_seed(0)
    model = ChatTTSLlama(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name
                    else torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def _kv(device: str = "cpu", allocate: bool = False) -> PagedKV:
    """The pool on `device` if `allocate`, else on the CPU with `device` only named (the backend-choice tests)."""
    pairs = allocate_kv_pairs(CONFIG.num_hidden_layers, NUM_BLOCKS + 1, BLOCK, HEADS, CONFIG.head_dim,
                              device=device if allocate else "cpu")
    return PagedKV(pairs, BLOCK, pad_block=NUM_BLOCKS, device=torch.device(device))


def _select(device: str = "cpu", **options):
    return select_backend(EngineConfig.from_kwargs(block_size=BLOCK, **options), _model(), _kv(device))


def test_triton_on_cpu_without_the_interpreter_is_an_error_saying_why(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="backend: 'triton' cannot run here: .*TRITON_INTERPRET is not 1"):
        _select(backend="triton")
    monkeypatch.setattr(triton_backend, "available", lambda: "triton is not installed (pip install triton)")
    with pytest.raises(ValueError, match=r"backend: 'triton' cannot run here: triton is not installed"):
        _select(backend="triton")


def test_auto_picks_triton_on_cuda_only(monkeypatch) -> None:
    monkeypatch.setattr(triton_backend, "available", lambda: None)
    monkeypatch.setattr(triton_backend, "TritonBackend", lambda *args: "the triton backend")
    assert _select("cuda") == "the triton backend"
    assert isinstance(_select("cpu"), TorchBackend)  # CPU: today's choice, even where the interpreter runs
    monkeypatch.setattr(triton_backend, "available", lambda: "no CUDA device")
    assert isinstance(_select("cuda"), TorchBackend)  # auto falls back only when triton was not asked for


def test_auto_falls_back_to_torch_with_one_warning_when_triton_fails_at_load(monkeypatch, caplog) -> None:
    def fails(*args):
        raise RuntimeError("ptxas: out of registers")

    monkeypatch.setattr(triton_backend, "available", lambda: None)
    monkeypatch.setattr(triton_backend, "TritonBackend", fails)
    with caplog.at_level("WARNING", logger="chattts_velocity"):
        backend = _select("cuda")
    assert isinstance(backend, TorchBackend)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "ptxas: out of registers" in warnings[0] and "torch backend" in warnings[0]
    with pytest.raises(RuntimeError, match="out of registers"):  # asked for by name: the error itself
        _select("cuda", backend="triton")


# ---- CUDA graphs: the ladder and the padded step -----------------------------------------------------


def test_graph_batch_sizes_double_up_to_max_num_seqs() -> None:
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert graph_batch_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert graph_batch_sizes(1) == [1]
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_batch_sizes(0)


def test_bucket_is_the_smallest_size_that_fits() -> None:
    sizes = graph_batch_sizes(48)
    assert [bucket(b, sizes) for b in (1, 2, 3, 5, 17, 33, 48)] == [1, 2, 4, 8, 32, 48, 48]
    assert bucket(49, sizes) is None


def test_padded_decode_pads_with_rows_that_write_only_the_pad_block() -> None:
    kv = _kv()
    step = StepTensors.from_lists([1, 1], [6, 1], [[3, 7], [9]], BLOCK, kv.device)
    positions, meta = padded_decode(step, kv, size=4, width=3)
    assert positions.tolist() == [5, 0, 0, 0]
    assert meta.slot_mapping.tolist() == [7 * BLOCK + 1, 9 * BLOCK, NUM_BLOCKS * BLOCK, NUM_BLOCKS * BLOCK]
    assert meta.block_tables.tolist() == [[3, 7, NUM_BLOCKS], [9, 0, NUM_BLOCKS], [NUM_BLOCKS] * 3, [NUM_BLOCKS] * 3]
    assert meta.context_lens.tolist() == [6, 1, 1, 1]


@pytest.mark.triton
@needs_triton
@torch.inference_mode()
def test_padded_graph_step_equals_the_eager_step_and_leaves_other_blocks_alone(triton_device) -> None:
    backend = select_backend(EngineConfig.from_kwargs(block_size=BLOCK, backend="triton"), _model().to(triton_device),
                             _kv(triton_device, allocate=True))
    kv = backend.kv
    lens, tables = [5, 9, 2], [[0, 1, 2], [3, 4, 5], [6, 7]]
    gen = torch.Generator().manual_seed(1)
    prefill = torch.randn(sum(lens), HIDDEN, generator=gen).to(kv.device)
    backend.run(prefill, StepTensors.from_lists(lens, lens, tables, BLOCK, kv.device))
    eager_kv = PagedKV([(k.clone(), v.clone()) for k, v in kv.pairs], BLOCK, kv.pad_block, kv.device)
    eager = TorchBackend(backend.model, eager_kv)
    graphs = DecodeGraphs(backend.decode_step, kv, graph_batch_sizes(8), width=4, hidden=HIDDEN, dtype=torch.float32)
    for step in range(2):  # 3 rows run in the size-4 buffers: one padding row
        positions = [n + step for n in lens]
        trimmed = [t[: p // BLOCK + 1] for t, p in zip(tables, positions, strict=True)]
        x = torch.randn(len(lens), HIDDEN, generator=gen).to(kv.device)
        step_inputs = StepTensors.from_lists([1] * 3, [p + 1 for p in positions], trimmed, BLOCK, kv.device)
        got, expected = graphs.run(x, step_inputs), decode(eager, x, positions, trimmed)
        assert got.shape == (3, HIDDEN) and (got - expected).abs().max().item() <= 1e-5
    for pools, eager_pools in zip(kv.pairs, eager_kv.pairs, strict=True):
        for pool, eager_pool in zip(pools, eager_pools, strict=True):
            assert (pool[:NUM_BLOCKS] - eager_pool[:NUM_BLOCKS]).abs().max().item() <= 1e-6


# ---- on a real GPU --------------------------------------------------------------------------------------


def _gpu_engine(tiny_assets, **options):
    return load_pretrained(tiny_assets, is_vllm=True, device="cuda", backend="triton", **options)


@pytest.mark.gpu
@needs_cuda
def test_graph_replay_equals_eager_on_gpu(chat: Chat, tiny_assets) -> None:
    requests = chat.speech_requests(split_pieces(TEXTS, split=False), _near_greedy(24))
    graphed = _gpu_engine(tiny_assets, max_num_seqs=8)
    assert graphed.engine.runner.backend.graphs is not None
    eager = _gpu_engine(tiny_assets, max_num_seqs=8)
    eager.engine.runner.backend.graphs = None  # every decode step eager
    for a, b in zip(graphed.generate(requests.prompts, requests.sampling, False),
                    eager.generate(requests.prompts, requests.sampling, False), strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert (a.hidden - b.hidden).abs().max().item() <= 1e-5


@pytest.mark.gpu
@needs_cuda
@torch.inference_mode()
def test_a_graphed_decode_step_never_syncs_the_host(tiny_assets) -> None:
    backend = _gpu_engine(tiny_assets, max_num_seqs=4).engine.runner.backend
    x = torch.randn(3, backend.model.config.hidden_size, device="cuda")
    positions, tables = [3, 1, 2], [[0], [1], [2]]
    # the step's inputs as the engine builds them (pinned copies) are test_sync's; here: the replay itself
    step = StepTensors.from_lists([1] * 3, [p + 1 for p in positions], tables, backend.kv.block_size, backend.kv.device)
    backend.run(x, step)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        backend.run(x, step)
    names = {event.name for event in prof.events()}
    assert not {n for n in names if "Synchronize" in n}, names
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.run(x, step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
