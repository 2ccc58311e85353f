"""The pipeline's calls: one at a time through the model, each with its own interrupt flag.

`CallGate` serialises the calls of every thread (the engine, the plain path's generator and the audio modules
are one set of state) and lets `interrupt()` stop every call in flight when it is made, the ones still waiting
for their turn included; a call that starts later is not affected. `PerTextRequests` is a shape-"each" job's
bookkeeping.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..schema import GenerationOutput, Prompt, SamplingParams, SpeechRequests, TextPieces
from .mel_source import MelSource

Stop = Callable[[], bool]


class CallGate:
    def __init__(self) -> None:
        self._turn = threading.Lock()  # held by the call that uses the model
        self._owner: int | None = None  # thread id of that call
        self._guard = threading.Lock()  # guards _flags
        self._flags: set[threading.Event] = set()

    @contextmanager
    def call(self, also: Stop | None = None) -> Iterator[Stop]:
        """Wait for the model, then yield this call's stop flag: set by interrupt(), or `also` (the caller's own)."""
        if self._owner == threading.get_ident():
            raise RuntimeError("Chat: this thread's earlier call (an open stream or infer_many) still holds the "
                               "model; finish or close() it before the next call")
        flag = threading.Event()
        with self._guard:
            self._flags.add(flag)
        try:
            with self._turn:
                self._owner = threading.get_ident()
                try:
                    yield flag.is_set if also is None else (lambda: flag.is_set() or also())
                finally:
                    self._owner = None
        finally:
            with self._guard:
                self._flags.discard(flag)

    @property
    def in_flight(self) -> int:
        """Calls running or waiting for their turn."""
        with self._guard:
            return len(self._flags)

    def interrupt(self) -> None:
        """Stop every call in flight (running or waiting) after its current step."""
        with self._guard:
            for flag in self._flags:
                flag.set()


class PerTextRequests:
    """infer_many's bookkeeping: every text's pieces in one flat request list, and which text is complete."""

    def __init__(self, pieces: TextPieces, mel: MelSource) -> None:
        self.pieces, self.mel = pieces, mel  # every text's pieces; what decodes their outputs
        self.failed: list[tuple[int, Exception]] = []  # texts refused before generation, with their errors
        self.prompts: list[Prompt] = []
        self.sampling: list[SamplingParams] = []
        self.owner: list[int] = []  # [P] text index of each flat piece
        self.outputs: dict[int, dict[int, GenerationOutput]] = {}  # text -> {piece: output}
        self.size: dict[int, int] = {}

    def add(self, i: int, requests: SpeechRequests) -> None:
        self.prompts += requests.prompts
        self.sampling += requests.sampling
        self.owner += [i] * len(requests.prompts)
        self.outputs[i], self.size[i] = {}, len(requests.prompts)

    def done(self, k: int, output: GenerationOutput) -> list[tuple[int, list[GenerationOutput] | Exception]]:
        """Record piece k; returns its text once complete (its outputs in piece order), or at its first error."""
        i = self.owner[k]
        if i not in self.outputs:
            return []  # this text already failed
        if output.error is not None:
            del self.outputs[i]
            return [(i, output.error)]
        self.outputs[i][k] = output
        if len(self.outputs[i]) < self.size[i]:
            return []
        pieces = self.outputs.pop(i)
        return [(i, [pieces[key] for key in sorted(pieces)])]
