"""A job made ready for the code pass: the one preparation every caller's audio goes through.

`Preparer.start` takes a job's checked pieces and decides the rest: the piece limit, each text's params (with the
loaded weights' step cap), and either the code requests (each reading the job's mel source) or, when the job has a
refine pass, the text generation it waits for first (`PreparedJob.pending`). The caller runs that generation on its
own engine and hands the token ids to `Preparer.refined`, which rewrites the pieces and builds the requests.
The local runner waits on GPTBackend.generate inside the call gate; the server's engine runner waits on its
AsyncLLMEngine without blocking its event loop. Only the waiting differs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..params import InferCodeParams
from ..schema import MAX_NEW_TOKEN, Prompt, SamplingParams, SpeechRequests, TextPieces
from .frontend import TextFrontEnd
from .job import SynthesisJob
from .mel_source import MelSource


@dataclass(frozen=True)
class TextGeneration:
    """Text-mode GPT work a preparation waits for (the refine pass): one prompt per piece, one sampling for all."""

    prompts: list[Prompt]
    sampling: SamplingParams
    progress: bool  # the refine params' show_tqdm


@dataclass(frozen=True)
class PreparedJob:
    """A job on its way to audio. `pending` is the text generation still to run (None once run, or with no refine
    pass); `requests` the code requests [pieces], each reading `mel` (None while pending, and for refine_only)."""

    job: SynthesisJob
    mel: MelSource
    pieces: TextPieces
    params: list[InferCodeParams]  # one per text, step-capped
    pending: TextGeneration | None = None
    requests: SpeechRequests | None = None

    def refined_texts(self) -> list[str]:
        """refine_only's answer: one string per text, its (refined) pieces joined by newlines."""
        return ["\n".join(group) for group in self.pieces.group(self.pieces.texts)]


class Preparer:
    """The decisions between a job and its code requests, for one text front end and the loaded weights' cap."""

    def __init__(self, frontend: TextFrontEnd, step_cap: int) -> None:
        self.frontend, self.step_cap = frontend, step_cap

    def start(self, job: SynthesisJob, mel: MelSource, pieces: TextPieces) -> PreparedJob:
        """The job's first state: pending on its refine pass, or with its code requests built."""
        check_piece_count(job, pieces)
        prepared = PreparedJob(job, mel, pieces, self.params(job))
        if job.refine is None:
            return self._with_requests(prepared)
        prompts, sampling = self.frontend.refine_requests(pieces, job.refine)
        return dataclasses.replace(prepared, pending=TextGeneration(prompts, sampling, job.refine.show_tqdm))

    def refined(self, prepared: PreparedJob, token_ids: list[torch.Tensor]) -> PreparedJob:
        """prepared after its pending generation: token_ids [T, 1] per prompt, in order."""
        if prepared.pending is None:
            raise RuntimeError("refined: this job waits for no text generation")
        if len(token_ids) != len(prepared.pending.prompts):
            raise ValueError(f"token_ids: expected one per refine prompt ({len(prepared.pending.prompts)}), "
                             f"got {len(token_ids)}")
        pieces = prepared.pieces.replace([self.frontend.refined_text(ids) for ids in token_ids])
        done = dataclasses.replace(prepared, pieces=pieces, pending=None)
        return done if prepared.job.refine_only else self._with_requests(done)

    def params(self, job: SynthesisJob) -> list[InferCodeParams]:
        """One InferCodeParams per text, step-capped unless the job brings its own cap."""
        return step_capped(job.params_list(), self.step_cap) if job.weights_step_cap else job.params_list()

    def _with_requests(self, prepared: PreparedJob) -> PreparedJob:
        requests = self.frontend.code_requests(prepared.pieces, prepared.params,
                                               return_hidden=prepared.mel.return_hidden)
        return dataclasses.replace(prepared, requests=requests)


def check_piece_count(job: SynthesisJob, pieces: TextPieces) -> None:
    """A ValueError naming `text` when the job's texts split into more than its max_pieces."""
    if job.max_pieces is not None and len(pieces.texts) > job.max_pieces:
        raise ValueError(f"text: splits into {len(pieces.texts)} sentence pieces, over the limit of {job.max_pieces}; "
                         "send fewer sentences per request")


def step_capped(params: list[InferCodeParams], cap: int) -> list[InferCodeParams]:
    """Each params with `cap` where max_new_token was left at InferCodeParams' default; an explicit max_new_token
    is kept. Texts that shared one params object still share its capped copy."""
    capped: dict[int, InferCodeParams] = {}  # id -> its capped copy
    for p in params:
        if isinstance(p, InferCodeParams) and p.max_new_token == MAX_NEW_TOKEN and cap < MAX_NEW_TOKEN:
            capped.setdefault(id(p), dataclasses.replace(p, max_new_token=cap))
    return [capped.get(id(p), p) for p in params]
