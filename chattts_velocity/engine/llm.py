"""Engine stage: LLM.generate — offline batch generation on the velocity engine, with a progress bar."""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

import numpy as np

from chattts_velocity.assets import AssetPaths
from chattts_velocity.config import ModelConfig
from chattts_velocity.engine.collect import Collectors
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.engine.progress import progress_bar
from chattts_velocity.model import Embed
from chattts_velocity.precision import Precision
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams, raise_first_error


class LLM:
    """The velocity GPT stage behind `load_pretrained(is_vllm=True)`: a GPTBackend (engine/gpt.py) over LLMEngine."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    @classmethod
    def from_assets(cls, paths: AssetPaths, precision: Precision | None = None, **engine_kwargs: Any) -> LLM:
        """The engine on these weights in `precision` (its device and dtypes, decided by the caller; None: the
        strings among engine_kwargs, else exact float32 on the CPU: EngineConfig.from_kwargs)."""
        return cls(LLMEngine.from_assets(paths, precision=precision, **engine_kwargs))

    @property
    def config(self) -> ModelConfig:
        return self.engine.config

    @property
    def embed(self) -> Embed:
        return self.engine.embed

    def generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams | list[SamplingParams],
        progress: bool = True,
        should_stop: Callable[[], bool] | None = None,
        max_batch: int | None = None,
    ) -> list[GenerationOutput]:
        """Generate every prompt concurrently; outputs in input order (max_batch: no padded batches to bound)."""
        outputs: list[GenerationOutput | None] = [None] * len(prompts)
        for index, output in self.generate_iter(prompts, params, progress, should_stop):
            outputs[index] = output
        return raise_first_error(outputs)  # type: ignore[arg-type]  # generate_iter fills every index

    def generate_iter(
        self,
        prompts: list[Prompt],
        params: SamplingParams | list[SamplingParams],
        progress: bool = True,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[tuple[int, GenerationOutput]]:
        """Like generate, but yields (index, output) as each request finishes; a request the engine refuses
        (too long, ...) comes back at once as a failed output (`error` set) and the others go on."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"params: got {len(params_list)} for {len(prompts)} prompts")
        ids: dict[str, int] = {}
        try:
            for k, (p, sp) in enumerate(zip(prompts, params_list, strict=True)):
                try:
                    ids[self.engine.add_request(None, p, sp)] = k
                except ValueError as exc:
                    yield k, GenerationOutput.failed(str(k), exc)
            for rid, output in self._drive(list(ids), [params_list[k] for k in ids.values()], progress, should_stop):
                yield ids[rid], output
        finally:  # an error or an early close leaves no request behind in the engine
            for rid in ids:
                self.engine.abort_request(rid)

    def stream(self, prompts: list[Prompt], params: list[SamplingParams], chunk_steps: int = 1,
               should_stop: Callable[[], bool] | None = None,
               due_rows: Collection[int] = ()) -> Iterator[list[tuple[int, GenerationOutput]]]:
        """New rows per prompt, stepped in the caller's thread; each yield holds at most one delta per prompt
        ([t, rows] tokens, [t, H] hidden, t <= chunk_steps but a beam search's whole result, rows in order), the last
        one of a prompt finished=True.

        A steady step's block joins the Collectors' log (engine/collect.py) and costs nothing per request; the rows are
        handed on every chunk_steps steps, and at once after a step that is not steady (prefill, admission, a batch
        change: it was per request anyway), when a request ends or fails, and when a prompt's row count reaches one of
        due_rows (the consumer's window ends: a window never waits for the cadence, so the first audio comes at the
        same step as with a hand-off every step). Interrupt hands on what is logged in the "interrupted" ends.
        """
        if len(params) != len(prompts):
            raise ValueError(f"params: got {len(params)} for {len(prompts)} prompts")
        if chunk_steps < 1:
            raise ValueError(f"chunk_steps: must be >= 1, got {chunk_steps}")
        index = {self.engine.add_request(None, p, s): k for k, (p, s) in enumerate(zip(prompts, params, strict=True))}
        collected = Collectors()
        for rid, k in index.items():
            collected.add(rid, self.engine.config.hidden_size if params[k].return_hidden else None)
        due = _due_table(due_rows)
        unended = dict(index)  # request id -> prompt index, until its end is handed on
        try:
            since = 0  # steps since the last hand-off
            while unended:
                if should_stop is not None and should_stop():
                    self._abort(collected)
                    yield self._hand_off(collected, unended)
                    return
                step = self.engine.step_deltas()
                finished = collected.take(step)[1]
                since += 1
                if since >= chunk_steps or finished or step.steady is None or _reaches(step.steady.counts, due):
                    since = 0
                    collected.flush()
                    if deltas := self._hand_off(collected, unended):
                        yield deltas
        finally:
            for rid in unended:
                self.engine.abort_request(rid)

    @staticmethod
    def _hand_off(collected: Collectors, unended: dict[str, int]) -> list[tuple[int, GenerationOutput]]:
        """(prompt index, its rows since the last hand-off) for every prompt with new rows or an end, in input order;
        the ended ones leave `unended`."""
        deltas = [(k, collected.by_id[rid].drain()) for rid, k in unended.items()
                  if collected.by_id[rid].pending or collected.by_id[rid].finished]
        for _, delta in deltas:
            if delta.finished:
                del unended[delta.request_id]
        return deltas

    def shutdown(self) -> None:
        """Abort whatever is still queued or running; the engine steps in its callers' threads, so nothing else."""
        scheduler = self.engine.scheduler
        for seq in [*scheduler.waiting, *scheduler.running]:
            self.engine.abort_request(seq.request_id)

    def _drive(self, ids: list[str], params_list: list[SamplingParams], progress: bool,
               should_stop: Callable[[], bool] | None) -> Iterator[tuple[str, GenerationOutput]]:
        hidden_size = self.engine.config.hidden_size
        collected = Collectors()
        for rid, sp in zip(ids, params_list, strict=True):
            collected.add(rid, hidden_size if sp.return_hidden else None)
        total = sum(sp.max_new_token for sp in params_list)
        mode = params_list[0].mode if params_list else "code"
        with progress_bar(total, mode, "step", enabled=progress) as bar:
            while any(not c.finished for c in collected.by_id.values()):
                if should_stop is not None and should_stop():
                    for rid in self._abort(collected):
                        yield rid, collected.by_id[rid].output()
                    return
                rows, finished = collected.take(self.engine.step_deltas())
                bar.update(rows)
                for rid in finished:
                    yield rid, collected.by_id[rid].output()

    def _abort(self, collected: Collectors) -> list[str]:
        """Abort every unfinished request (interrupt); returns their ids."""
        collected.flush()
        aborted = [c.request_id for c in collected.by_id.values() if not c.finished]
        for rid in aborted:
            self.engine.abort_request(rid)
            collected.by_id[rid].finished, collected.by_id[rid].finish_reason = True, "interrupted"
        return aborted


def _due_table(due_rows: Collection[int]) -> np.ndarray | None:
    """[max + 2] bool: True at each row count in due_rows (the last entry stands for every larger count); None: none."""
    if not due_rows:
        return None
    table = np.zeros(max(due_rows) + 2, dtype=bool)
    table[[n for n in due_rows if n >= 0]] = True
    return table


def _reaches(counts: np.ndarray, due: np.ndarray | None) -> bool:
    """Whether a slot's row count (counts [N]) is one of the due ones."""
    return due is not None and bool(due[np.minimum(counts, len(due) - 1)].any())
