"""compile=True: the decode step as one torch.compile'd layer graph — same numbers, no recompiles, KV in place."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

from chattts_velocity import Chat, InferCodeParams, load_pretrained
from chattts_velocity.model import DecodeMetadata
from chattts_velocity.model.llama import run_decoder_layer
from chattts_velocity.text import Tokenizer

# Every test here waits for inductor: ~25 s on a first run (a cold inductor cache), so the module is in the slow suite.
pytestmark = pytest.mark.slow

TEXTS = ["Hello world.", "你好，今天天气很好。", "Short", "A somewhat longer English sentence here."]


@pytest.fixture(scope="module")
def compiled_fp32(tiny_assets):
    return load_pretrained(tiny_assets, is_vllm=True, compile=True, block_size=4)


def _prompts(assets, texts):
    tok = Tokenizer(assets / "asset" / "tokenizer")
    return [tok.code_prompt(t) for t in texts]


def _params(steps: int, seed: int | None = None):
    return InferCodeParams(temperature=1e-6, max_new_token=steps, min_new_token=steps, manual_seed=seed,
                           show_tqdm=False).to_sampling_params("code", 625, return_hidden=True)


def test_compiled_fp32_equals_the_plain_path(tiny_assets, compiled_fp32) -> None:
    assert compiled_fp32.engine.metrics()["backend"] == "torch.compile"
    prompts = _prompts(tiny_assets, TEXTS)
    plain = load_pretrained(tiny_assets).generate(prompts, _params(24), progress=False)
    fast = compiled_fp32.generate(prompts, _params(24), progress=False)
    for a, b in zip(plain, fast, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert (a.hidden - b.hidden).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_no_recompiles_once_warmed_up(tiny_assets, compiled_fp32, dtype) -> None:
    llm = compiled_fp32 if dtype == "float32" else load_pretrained(tiny_assets, is_vllm=True, compile=True,
                                                                    block_size=4, dtype=dtype)
    llm.generate(_prompts(tiny_assets, TEXTS[:1]), _params(3), progress=False)
    before = dict(counters["stats"])
    # batch sizes 1..7 (bf16 switches kernels at 5 rows, inside the op) and contexts crossing several
    # 4-position blocks: only dynamic sizes change
    for n in (1, 3, 7, 5, 2):
        llm.generate(_prompts(tiny_assets, (TEXTS * 2)[:n]), _params(9, seed=n), progress=False)
    assert dict(counters["stats"]) == before


def test_compiled_step_writes_the_kv_pool_in_place(compiled_fp32) -> None:
    runner = compiled_fp32.engine.runner
    layer, (k_pool, v_pool) = runner.model.layers[0], runner.kv_cache[0]
    meta = DecodeMetadata(torch.tensor([5, 9]), torch.tensor([[1, 2], [2, 3]]), torch.tensor([6, 7]))
    x = torch.randn(2, runner.config.hidden_size)

    def layer_step(*args):  # its own code object: compiled afresh, not served from the runner's cache
        return run_decoder_layer(*args)

    saved = (k_pool.clone(), v_pool.clone())  # the fixture's prefix cache may hold these blocks
    with torch.inference_mode(), torch._inductor.config.patch(fx_graph_cache=False):
        _, code = run_and_get_code(torch.compile(layer_step, fullgraph=True), layer, x, torch.tensor([5, 6]),
                                   runner.model.rotary_emb, (k_pool, v_pool), meta)
        k_pool.copy_(saved[0])
        v_pool.copy_(saved[1])
    assert code
    # a copy of the pool would loop over all of its elements
    assert not any(f"{k_pool.numel()}L" in c for c in code)


def test_chat_load_compile_bfloat16_runs(tiny_assets) -> None:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, compile=True, dtype="bfloat16",
              use_vllm=True)
    params = InferCodeParams(max_new_token=8, min_new_token=8, manual_seed=3, show_tqdm=False)
    wavs = chat.infer(TEXTS[:2], skip_refine_text=True, params_infer_code=params)
    assert [len(w) for w in wavs] == [(2 * 8 - 1) * 256] * 2


def test_engines_of_other_dtypes_in_one_process_keep_their_own_graphs(tiny_assets) -> None:
    # all engines compile the same Python function; the graphs of engines built later must be told apart
    # from the fp32 one, and the fp32 engine must keep running its own graph afterwards
    compiled_fp32 = load_pretrained(tiny_assets, is_vllm=True, compile=True, block_size=4)
    prompts = _prompts(tiny_assets, TEXTS[:2])
    compiled_fp32.generate(prompts, _params(4), progress=False)
    for dtype in ("bfloat16", "int8"):
        other = load_pretrained(tiny_assets, is_vllm=True, compile=True, block_size=4, dtype=dtype)
        reduced = other.generate(prompts, _params(12), progress=False)
        plain = load_pretrained(tiny_assets).generate(prompts, _params(12), progress=False)
        exact = compiled_fp32.generate(prompts, _params(12), progress=False)
        for p, e, r in zip(plain, exact, reduced, strict=True):
            assert torch.equal(p.token_ids, e.token_ids) and (p.hidden - e.hidden).abs().max().item() <= 1e-4
            # its own, reduced-precision graph: close to fp32 until the first differing code changes the history
            same = (p.token_ids == r.token_ids).all(dim=1).long()
            agree = int(same.cumprod(0).sum())
            assert agree >= 1 and not torch.equal(p.hidden, r.hidden)
            assert (p.hidden[: agree + 1] - r.hidden[: agree + 1]).abs().max().item() < 0.5
