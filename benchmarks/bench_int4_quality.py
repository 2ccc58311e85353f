"""int4 quality against llama.cpp's Q4_0 on the same weights: teacher-forced agreement with float32 logits.

float32 generates `--steps` near-greedy steps for `--seqs` prompts; every scheme then scores that same trajectory
(one prefill per sequence) and is compared with float32's code logits at each (position, codebook): top-1 agreement
(the argmaxes equal), top-5 (float32's argmax among the scheme's five best) and the logits' cosine similarity.

Schemes, all on the same weights:
- the engine at "int8" and "int4" (our kernels: packed weights times the kernels' activations, bf16 elsewhere);
- in float32 with only the 80 layer linears quantised (their weights dequantised, their inputs quantised per row
  and 32 columns), as llama.cpp computes them: "q4_0" is llama.cpp's Q4_0 weights times Q8_0 activations,
  emulated from the formats' definitions; "int4" our int4 quantiser (kernels.quantize_int4) times our Q8 rows
  (kernels.quantize_q8_rows); "int4_absmax7" symmetric int4 with scale absmax / 7 (15 levels) for reference.
The 4-bit schemes also report the weights' relative RMS error. Random weights put many logits near a tie, so top-1
agreement is low for any 4-bit scheme; top-5 and the cosine show how close the logits stay.

    python benchmarks/bench_int4_quality.py --model .pytest-assets/full        # ~5 minutes on 2 cores
    python benchmarks/bench_int4_quality.py --model .pytest-assets/tiny --seqs 2 --steps 8 --out /tmp/q.json
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from chattts_velocity import load_pretrained
from chattts_velocity.engine.worker.step_inputs import StepTensors  # noqa: E402
from chattts_velocity.model import build_attention_metadata, kernels  # noqa: E402
from chattts_velocity.model.packed import fuse_rows  # noqa: E402
from chattts_velocity.params import InferCodeParams  # noqa: E402
from chattts_velocity.text import Tokenizer, sample_random_speaker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

BLOCK = 32  # columns per scale in every 4-bit and 8-bit scheme here
ENGINE_SCHEMES = ("int8", "int4")


def q4_0_weight(w: torch.Tensor) -> torch.Tensor:
    """llama.cpp's Q4_0 round trip of w [N, K]: per block of 32 along K, d = (the signed value of largest
    magnitude) / -8, q = clamp(trunc(w / d + 8.5), 0, 15), w ~= (q - 8) * d with d stored as fp16."""
    blocks = w.float().reshape(w.shape[0], -1, BLOCK)
    extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))  # [N, K/32, 1]
    d = extreme / -8
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    q = torch.trunc(blocks * inverse + 8.5).clamp(0, 15)
    return ((q - 8) * d.half().float()).reshape(w.shape)


def q8_0_rows(x: torch.Tensor) -> torch.Tensor:
    """llama.cpp's Q8_0 round trip of activations x [M, K]: per block of 32, d = max |x| / 127, q = x / d rounded
    half away from zero, x ~= q * d with d stored as fp16."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    scaled = blocks * inverse
    q = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    return (q * d.half().float()).reshape(x.shape)


def ours_int4_weight(w: torch.Tensor) -> torch.Tensor:
    q, scales = kernels.quantize_int4(w.float())
    return q.float() * scales.repeat_interleave(BLOCK, dim=1)


def absmax7_weight(w: torch.Tensor) -> torch.Tensor:
    blocks = w.float().reshape(w.shape[0], -1, BLOCK)
    scale = (blocks.abs().amax(-1, keepdim=True) / 7).clamp(min=1e-12)
    return (torch.round(blocks / scale).clamp(-7, 7) * scale).reshape(w.shape)


def ours_q8_rows(x: torch.Tensor) -> torch.Tensor:
    q, scales = kernels.quantize_q8_rows(x)
    return (q.float().reshape(x.shape[0], -1, BLOCK) * scales[..., None]).reshape(x.shape)


EMULATED: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "q4_0": (q4_0_weight, q8_0_rows),
    "int4": (ours_int4_weight, ours_q8_rows),
    "int4_absmax7": (absmax7_weight, ours_q8_rows),
}


class EmulatedLinear(torch.nn.Module):
    """x @ W.T in float32 with W already round-tripped through a weight format and x through an activation one."""

    def __init__(self, weight: torch.Tensor, rows: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.weight, self.rows = weight, rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.rows(x.float()), self.weight)


def emulate(model, scheme: str) -> float:
    """Route the float32 model's 80 layer linears through `scheme`; returns the weights' relative RMS error."""
    weight_format, rows = EMULATED[scheme]
    error = total = 0.0
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights = {"qkv": fuse_rows(attn.q_proj, attn.k_proj, attn.v_proj), "o": attn.o_proj.weight.detach(),
                   "gate_up": fuse_rows(mlp.gate_proj, mlp.up_proj), "down": mlp.down_proj.weight.detach()}
        linears = {}
        for name, weight in weights.items():
            quantised = weight_format(weight)
            error += (quantised - weight.float()).square().sum().item()
            total += weight.float().square().sum().item()
            linears[name] = EmulatedLinear(quantised, rows)
        attn.qkv_packed, attn.o_packed = linears["qkv"], linears["o"]
        mlp.gate_up_packed, mlp.down_packed = linears["gate_up"], linears["down"]
    return (error / total) ** 0.5


def restore(model) -> None:
    for layer in model.layers:
        layer.self_attn.qkv_packed = layer.self_attn.o_packed = None
        layer.mlp.gate_up_packed = layer.mlp.down_packed = None


def trajectory(llm, assets: Path, seqs: int, steps: int) -> tuple[list, list[torch.Tensor]]:
    """float32's prompts and near-greedy codes [steps, 4] per sequence."""
    tok = Tokenizer(assets / "asset" / "tokenizer")
    torch.manual_seed(0)
    speaker = sample_random_speaker(llm.config.hidden_size)
    prompts = [tok.code_prompt(f"Sentence number {i} for the agreement test.", speaker) for i in range(seqs)]
    params = InferCodeParams(temperature=1e-6, max_new_token=steps, min_new_token=steps, show_tqdm=False)
    outputs = llm.generate(prompts, params.to_sampling_params("code", 625, return_hidden=True), progress=False)
    return prompts, [o.token_ids for o in outputs]


@torch.inference_mode()
def scored_logits(llm, prompts, codes: list[torch.Tensor]) -> torch.Tensor:
    """Code logits [sum T, 4, V] predicting each generated position, from one prefill of prompt + codes each."""
    runner, logits = llm.engine.runner, []
    for prompt, seq_codes in zip(prompts, codes, strict=True):
        ids = torch.cat([prompt.input_ids, seq_codes])  # [P + T, 4]
        mask = torch.cat([prompt.text_mask, torch.zeros(len(seq_codes), dtype=torch.bool)])
        embeds = runner.embed.embed(ids, mask)
        embeds[list(prompt.spk_positions)] = prompt.spk_emb
        blocks = list(range(-(-len(ids) // runner.block_size)))
        meta = build_attention_metadata([len(ids)], [len(ids)], [blocks], runner.block_size)
        step = StepTensors.from_attention_metadata(meta, runner.backend.kv.block_size)
        hidden = runner.backend.run(embeds.to(runner.act_dtype), step).float()
        logits.append(runner.embed.code_logits(hidden[len(prompt) - 1 : -1]))
    return torch.cat(logits)


def agreement(reference: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    best = reference.argmax(-1)  # [T, 4]
    return {"top1": (logits.argmax(-1) == best).float().mean().item(),
            "top5": (logits.topk(5, dim=-1).indices == best[..., None]).any(-1).float().mean().item(),
            "cosine": F.cosine_similarity(reference, logits, dim=-1).mean().item()}


def measure(assets: Path, seqs: int, steps: int) -> dict:
    fp32 = load_pretrained(assets, is_vllm=True, dtype="float32")
    prompts, codes = trajectory(fp32, assets, seqs, steps)
    reference = scored_logits(fp32, prompts, codes)
    schemes = {"float32": agreement(reference, reference)}
    for scheme in EMULATED:
        rmse = emulate(fp32.engine.runner.model, scheme)
        schemes[f"emulated_{scheme}"] = {**agreement(reference, scored_logits(fp32, prompts, codes)),
                                         "weight_rel_rmse": rmse}
        restore(fp32.engine.runner.model)
    del fp32
    for dtype in ENGINE_SCHEMES:
        llm = load_pretrained(assets, is_vllm=True, dtype=dtype)
        schemes[f"engine_{dtype}"] = agreement(reference, scored_logits(llm, prompts, codes))
        del llm
    return schemes


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / ".pytest-assets" / "full"))
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "int4_quality.json"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    schemes = measure(Path(args.model), args.seqs, args.steps)
    report = {"model": Path(args.model).name, "seqs": args.seqs, "steps": args.steps, "scoring": "prefill",
              "kernel_path": kernels.kernel_path(), "schemes": schemes,
              "int4_minus_q4_0_top1": schemes["emulated_int4"]["top1"] - schemes["emulated_q4_0"]["top1"],
              "seconds": round(time.perf_counter() - start, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for name, row in schemes.items():
        print(f"{name:24s} " + "  ".join(f"{k} {v:.4f}" for k, v in row.items()))
    print(f"-> {args.out}")
    return report


if __name__ == "__main__":
    main()
