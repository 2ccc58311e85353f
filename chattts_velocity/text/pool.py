"""Text stage: normalising in a worker process, for the server's long texts.

wetext's grammars run in C++ without releasing the GIL, so long text work on a thread slows every other thread of
the server (the engine's steps, the decode thread): a live stream stalled 2.6 s while three 4096-character texts
were normalised. A worker process shares no GIL. It builds its own default Normalizer, so only a Chat whose
normalizer holds just the defaults (`uses_default_normalizers`) sends its texts here.
"""
from __future__ import annotations

import os
import threading
import time

from chattts_velocity.schema import TextPieces
from chattts_velocity.text.budget import time_budget
from chattts_velocity.text.normalizer import HOMOPHONES_PATH, Normalizer, load_homophones
from chattts_velocity.text.numbers import SpokenText
from chattts_velocity.text.pieces import normalized_pieces

_normalizer: Normalizer | None = None  # the worker process's own
WORKER_NICENESS = 10  # on a busy host the engine and the decode thread come first; a text may wait


def start_worker() -> None:
    """A worker process's initializer: load the grammars once; end with the server process."""
    global _normalizer
    os.nice(WORKER_NICENESS)
    _normalizer = Normalizer()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:  # a killed server must not leave its workers behind
        time.sleep(1.0)
    os._exit(0)


def split_in_worker(texts: str | list[str], lang: str | None, normalize: bool, homophones: bool, split: bool,
                    started: float | None, budget_s: float | None) -> TextPieces:
    """TextFrontEnd.pieces(texts, lang=lang, normalize=normalize, homophones=homophones, split=split) with the
    worker's normaliser, under the budget (budget.time_budget: CPU time in the worker unless `started`)."""
    normalizer = worker_normalizer()
    with time_budget(budget_s, started):
        return normalized_pieces(texts, lambda p: normalizer(p, normalize, homophones, lang), split)


def worker_normalizer() -> Normalizer:
    if _normalizer is None:
        raise RuntimeError("split_in_worker: runs in the processes the text pool started (their initializer)")
    return _normalizer


def uses_default_normalizers(normalizer: Normalizer) -> bool:
    """Whether a worker's fresh Normalizer reads text exactly as `normalizer` does."""
    return (set(normalizer.normalizers) <= {"zh", "en"}
            and all(isinstance(fn, SpokenText) for fn in normalizer.normalizers.values())
            and normalizer.homophones == load_homophones(HOMOPHONES_PATH))
