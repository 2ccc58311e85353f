"""The plain GPT path's beam search: BeamState over transformers' LlamaModel, live beams as one batch.

In: one Prompt and SamplingParams with beam_width. Out: its best hypothesis as a GenerationOutput (tokens [T, 1]).
The live beams share one DynamicCache, reordered by their parents at every step (index_select on the batch axis).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from chattts_velocity.engine.beams.search import BeamState, beam_logprobs
from chattts_velocity.model.embed import Embed
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams


class PlainStage(Protocol):
    """What the beam search reads of a PlainGPT."""

    llama: torch.nn.Module  # transformers' LlamaModel
    embed: Embed
    device: torch.device

    def prompt_embeddings(self, prompts: list[Prompt], ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        """[B, P, H] input embeddings of left-padded prompts (ids [B, P, num_vq], text_mask [B, P])."""


@torch.inference_mode()
def plain_beam_search(gpt: PlainStage, prompt: Prompt, params: SamplingParams,
                      should_stop: Callable[[], bool] | None = None, request_id: str = "0") -> GenerationOutput:
    state = BeamState(params)
    ids = prompt.input_ids.unsqueeze(0).to(gpt.device)  # [1, P, num_vq]
    embeds = gpt.prompt_embeddings([prompt], ids, prompt.text_mask.unsqueeze(0).to(gpt.device))  # [1, P, H]
    positions = torch.arange(len(prompt), device=gpt.device).unsqueeze(0)  # [1, P]
    out = gpt.llama(inputs_embeds=embeds, position_ids=positions, cache=None, use_cache=True)
    cache, hidden = out.cache, out.last_hidden_state[:, -1]  # [1, H]
    for length in range(len(prompt), len(prompt) + params.max_new_token):
        logprobs, failures = beam_logprobs(gpt.embed, hidden, state.live, params)
        if failures:
            raise next(iter(failures.values()))
        parents = state.step(logprobs)
        if state.done or (should_stop is not None and should_stop()):
            break
        cache.reorder_cache(torch.tensor(parents, device=gpt.device))
        tokens = torch.tensor([b.tokens[-1] for b in state.live], device=gpt.device)  # [S]
        embeds = gpt.embed.embed_text(tokens).unsqueeze(1)  # [S, 1, H]
        positions = torch.full((len(tokens), 1), length, device=gpt.device)
        out = gpt.llama(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True)
        hidden = out.last_hidden_state[:, -1]  # [S, H]
    best = state.best()
    tokens = torch.tensor(best.tokens, dtype=torch.int64).view(-1, 1)  # [T, 1]
    return GenerationOutput(request_id, tokens, None, True, best.reason,
                            extra={"num_generated": len(best.tokens), "beam_score": best.score,
                                   "beam_logprob": best.logprob})
