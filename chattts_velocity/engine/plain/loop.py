"""The plain GPT path: transformers `LlamaModel` driven by upstream's batched, left-padded loop.

This is the baseline and the correctness oracle (spec section 7). It keeps upstream's numbers:
left padding, one set of sampling params per batch, `manual_seed` re-seeding the generator at
every step. It does not keep upstream's bugs (design.md section 9): the text-phase penalty gets a
2-D history, and "regenerate to ensure non-empty" is bounded.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from chattts_velocity.config import ModelConfig
from chattts_velocity.engine.plain.beams import plain_beam_search
from chattts_velocity.engine.progress import progress_bar
from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.model.embed import Embed
from chattts_velocity.model.loader import gpt_state_dict, load_embed
from chattts_velocity.precision import Precision
from chattts_velocity.schema import (
    MAX_REGENERATE,
    FinishReason,
    GenerationOutput,
    Prompt,
    SamplingParams,
    check_prompt_fits,
    pad_left,
)

if TYPE_CHECKING:
    from transformers import DynamicCache

logger = logging.getLogger("chattts_velocity")


class PlainGPT:
    """The plain GPT stage behind `load_pretrained(is_vllm=False)`: a GPTBackend (engine/gpt.py)."""

    def __init__(self, llama: torch.nn.Module, embed: Embed, config: ModelConfig) -> None:
        self.llama, self.embed, self.config = llama.eval(), embed.eval(), config
        self.engine = None  # GPTBackend.engine: this path steps no LLMEngine
        self.device = next(embed.parameters()).device

    @classmethod
    def load(cls, gpt_dir: str | Path, embed_path: str | Path, precision: Precision | None = None) -> PlainGPT:
        """transformers `LlamaModel` (SDPA, fp32) with the checkpoint's weights, loaded by key, on the precision's
        device (None: the CPU); the plain path runs exact float32 only.

        Built from config.json and filled from model.safetensors ourselves (not `from_pretrained`),
        so files written by any safetensors tool load; `embed_tokens` is dropped as upstream does.
        """
        from transformers import LlamaConfig, LlamaModel
        from transformers.initialization import no_init_weights

        precision = precision or Precision.decide()
        if not precision.exact:
            raise ValueError(f"dtype: the plain path runs float32 only, got {precision.dtype!r}")
        device = precision.device
        config = ModelConfig.from_json(Path(gpt_dir) / "config.json")
        hf_config = LlamaConfig.from_pretrained(str(gpt_dir))
        hf_config._attn_implementation = "sdpa"
        with no_init_weights():
            llama = LlamaModel(hf_config)
        llama.embed_tokens = None  # type: ignore[assignment]  # never used: inputs are embeddings (upstream deletes it too)
        llama.load_state_dict(gpt_state_dict(gpt_dir), strict=True)
        llama = llama.to(device)  # type: ignore[arg-type]  # transformers types its wrapped .to() as unbound
        return cls(llama.float(), load_embed(embed_path).to(device), config)

    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams | list[SamplingParams],
        progress: bool = False,
        should_stop: Callable[[], bool] | None = None,
        max_batch: int | None = None,
    ) -> list[GenerationOutput]:
        """Upstream's batches: at most max_batch prompts (default: all) left-padded together, one params set each."""
        size = max(1, max_batch or len(prompts))
        outputs: list[GenerationOutput] = []
        for start in range(0, len(prompts), size):
            outputs += self._generate_batch(prompts[start:start + size], params, progress, should_stop)
        return outputs

    def generate_iter(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams],
                      progress: bool = False, should_stop: Callable[[], bool] | None = None,
                      ) -> Iterator[tuple[int, GenerationOutput]]:
        """One prompt at a time, each with its own params (a padded batch shares one set); a prompt that fails
        comes back as a failed output (`error` set) and the others go on."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        for k, (prompt, sampling) in enumerate(zip(prompts, params_list, strict=True)):
            try:
                yield k, self._generate_batch([prompt], sampling, progress, should_stop)[0]
            except (ValueError, RuntimeError) as exc:
                yield k, GenerationOutput.failed(str(k), exc)

    def stream(self, prompts: list[Prompt], params: list[SamplingParams], chunk_steps: int,
               should_stop: Callable[[], bool] | None = None,
               due_rows: Collection[int] = ()) -> Iterator[list[tuple[int, GenerationOutput]]]:
        """The plain loop has no step API: generate whole, then hand out chunk_steps rows at a time (every row is
        there before the first yield, so due_rows changes nothing)."""
        for k, out in enumerate(self.generate(prompts, params, progress=False, should_stop=should_stop)):
            n = len(out.token_ids)
            for start in range(0, max(n, 1), chunk_steps):
                hidden = None if out.hidden is None else out.hidden[start: start + chunk_steps]
                yield [(k, GenerationOutput(out.request_id, out.token_ids[start: start + chunk_steps], hidden,
                                            start + chunk_steps >= n, out.finish_reason))]

    def shutdown(self) -> None:
        """Nothing runs in the background: the loop lives in its callers' threads."""

    @torch.inference_mode()
    def _generate_batch(self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams],
                        progress: bool, should_stop: Callable[[], bool] | None) -> list[GenerationOutput]:
        params = _single_params(params)
        self._check_length(prompts, params)
        if params.beam_width > 1:
            return [plain_beam_search(self, p, params, should_stop, str(k)) for k, p in enumerate(prompts)]
        for _attempt in range(MAX_REGENERATE + 1):
            outputs, empty_first_step = self._generate_once(prompts, params, progress, should_stop)
            if not (empty_first_step and params.ensure_non_empty and params.seed is None):
                return outputs
            logger.warning("unexpected end at the first step; regenerating to ensure non-empty output")
        return outputs

    def _check_length(self, prompts: list[Prompt], params: SamplingParams) -> None:
        """The padded batch plus every step must fit the model's positions (as the engine's max_model_len)."""
        check_prompt_fits(max(len(p) for p in prompts), params.max_new_token, self.config.max_position_embeddings,
                          "max_position_embeddings")

    def _generate_once(self, prompts: list[Prompt], params: SamplingParams, progress: bool,
                       should_stop: Callable[[], bool] | None) -> tuple[list[GenerationOutput], bool]:
        ids, mask, text_mask = pad_left(prompts)  # [B, L, 4], [B, L], [B, L]
        ids, mask = ids.to(self.device), mask.bool().to(self.device)
        emb = self.prompt_embeddings(prompts, ids, text_mask.to(self.device))
        loop = BatchLoop(self, params, ids, mask)
        bar = progress_bar(params.max_new_token, params.mode, "step", enabled=progress)
        with bar:
            for step in range(params.max_new_token):
                emb = loop.step(step, emb)
                bar.update(1)
                if step == 0 and loop.finish.any() and params.ensure_non_empty and params.seed is None:
                    return loop.outputs(), True
                if loop.finish.all() or (should_stop is not None and should_stop()):
                    break
        return loop.outputs(should_stop is not None and should_stop()), False

    def prompt_embeddings(self, prompts: list[Prompt], ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        """ids [B, L, num_vq] (left-padded), text_mask [B, L] -> [B, L, H] with each speaker vector in its rows."""
        emb = self.embed.embed(ids, text_mask)  # [B, L, H]
        width = ids.shape[1]
        for row, prompt in enumerate(prompts):
            if prompt.spk_emb is not None and prompt.spk_positions:
                pad = width - len(prompt)
                positions = [pad + p for p in prompt.spk_positions]
                emb[row, positions] = prompt.spk_emb.to(emb)
        return emb


class BatchLoop:
    """State of one batched generation: upstream's loop over a left-padded batch, one step per call."""

    def __init__(self, gpt: PlainGPT, params: SamplingParams, ids: torch.Tensor, mask: torch.Tensor) -> None:
        self.gpt, self.params = gpt, params
        self.text_mode = params.mode == "text"
        batch, self.start = ids.shape[0], ids.shape[1]
        self.rows = 1 if self.text_mode else gpt.config.num_vq
        total = self.start + params.max_new_token
        self.ids = torch.zeros(batch, total, ids.shape[2], dtype=torch.long, device=ids.device)
        self.ids[:, : self.start] = ids
        self.mask = torch.ones(batch, total, dtype=torch.bool, device=ids.device)
        self.mask[:, : self.start] = mask
        self.progress = self.start
        self.end = torch.zeros(batch, dtype=torch.long)
        self.finish = torch.zeros(batch, dtype=torch.bool)
        self.hiddens: list[torch.Tensor] = []
        temps = torch.tensor(params.temperatures(self.rows), dtype=torch.float32, device=ids.device)
        self.temperatures = temps.repeat(batch)  # [B * rows], row b*rows+q
        self.cache: DynamicCache | None = None
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator(device=ids.device)

    def step(self, step: int, emb: torch.Tensor) -> torch.Tensor:
        hidden = self._forward(step, emb)  # [B, H], the state that predicts this step's token
        if self.params.return_hidden:
            self.hiddens.append(hidden.float())
        logits = self._logits(hidden)
        logits = self._process(logits, step)
        tokens = self._sample(logits).view(-1, self.rows)  # [B, rows]
        self.finish |= (tokens == self.params.eos_token_id).any(1).cpu()
        self.ids[:, self.progress] = tokens if not self.text_mode else tokens.expand(-1, self.ids.shape[2])
        self.progress += 1
        self.end += (~self.finish).long()
        return self._next_embeddings(tokens)

    def _forward(self, step: int, emb: torch.Tensor) -> torch.Tensor:
        mask = self.mask[:, : self.progress].long()
        positions = mask.cumsum(-1) - 1
        positions.masked_fill_(mask == 0, 1)
        if step > 0:
            positions = positions[:, -1:]
        # step 0 passes no cache, so LlamaModel starts a DynamicCache; its length places the new keys in the mask
        out = self.gpt.llama(
            inputs_embeds=emb, attention_mask=mask, position_ids=positions,
            cache=self.cache, use_cache=True,
        )
        self.cache = out.cache
        hidden: torch.Tensor = out.last_hidden_state[:, -1]
        return hidden

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.text_mode:
            return self.gpt.embed.text_logits(hidden).float()  # [B, V_text]
        logits = self.gpt.embed.code_logits(hidden).float()  # [B, 4, V_audio]
        return logits.reshape(-1, logits.shape[-1])  # [B * 4, V], row b*4+q

    def _history(self) -> torch.Tensor:
        generated = self.ids[:, self.start : self.progress, : self.rows]  # [B, G, rows]
        return generated.permute(0, 2, 1).reshape(generated.shape[0] * self.rows, generated.shape[1])  # [B * rows, G]

    def _process(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        params = self._row_params(logits, step)
        logits = lp.process(logits, params)
        if params.failures:  # a padded batch shares one set of processors: it fails as a whole
            raise next(iter(params.failures.values()))
        return logits

    def _row_params(self, logits: torch.Tensor, step: int) -> lp.RowParams:
        """The batch's one set of params as per-row tensors [B * rows], with upstream's penalty quirk."""
        p, (num_rows, vocab), device = self.params, logits.shape, logits.device
        history = self._history()  # [B * rows, G]
        window = history[:, history.shape[1] - min(p.penalty_window, history.shape[1]):]

        def full(value: float | int | bool, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((num_rows,), value, dtype=dtype, device=device)

        penalties = None
        if p.repetition_penalty != 1.0:
            penalties = full(p.repetition_penalty, torch.float32)
            penalties[upstream_penalty_row_limit(vocab, self.text_mode):] = 1.0
        return lp.RowParams(
            rows_per_seq=self.rows, temperatures=self.temperatures,
            eos_ids=full(p.eos_token_id, torch.int64), mask_eos=full(step < p.min_new_token, torch.bool),
            penalties=penalties, history=window,
            top_p=None if p.top_p is None else full(p.top_p, torch.float32),
            top_k=None if p.top_k is None else full(p.top_k, torch.int64),
            custom=[(b, p.logits_processors, history[b * self.rows:(b + 1) * self.rows].T)
                    for b in range(num_rows // self.rows) if p.logits_processors],
        )

    def _sample(self, logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits, dim=-1)
        if self.generator is None or self.params.seed is None:
            return torch.multinomial(probs, 1)
        return torch.multinomial(probs, 1, generator=self.generator.manual_seed(self.params.seed))

    def _next_embeddings(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.text_mode:
            return self.gpt.embed.embed_text(tokens[:, 0]).unsqueeze(1)  # [B, 1, H]
        return self.gpt.embed.embed_codes(tokens).unsqueeze(1)  # [B, 1, H]

    def outputs(self, interrupted: bool = False) -> list[GenerationOutput]:
        hiddens = torch.stack(self.hiddens, 1) if self.hiddens else None  # [B, steps, H]
        results = []
        for b, n in enumerate(self.end.tolist()):
            tokens = self.ids[b, self.start : self.start + n, : self.rows].cpu()
            reason: FinishReason = "eos" if self.finish[b] else ("interrupted" if interrupted else "length")
            results.append(GenerationOutput(
                request_id=str(b), token_ids=tokens,
                hidden=hiddens[b, :n].cpu() if hiddens is not None else None,
                finished=True, finish_reason=reason,
            ))
        return results


def upstream_penalty_row_limit(vocab: int, text_mode: bool) -> int:
    """Upstream quirk, kept only by this path (the oracle): the reference's penalty processor leaves every
    row whose index in the batch reaches its num_code (625 codes; the whole vocabulary in text mode)
    unpenalised. Only batches with B * 4 > 625 rows see it; the engine penalises every row."""
    return vocab - (0 if text_mode else 1)


def _single_params(params: SamplingParams | list[SamplingParams]) -> SamplingParams:
    if isinstance(params, SamplingParams):
        return params
    first = params[0]
    if any(p is not first and p != first for p in params[1:]):
        raise ValueError("params: the plain path samples a batch with one set of params; use is_vllm=True")
    return first
