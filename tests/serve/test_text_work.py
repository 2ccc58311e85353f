"""The server's text work off the event loop: long texts in a worker process read as on a thread, a dead worker
is replaced, and the budget counts from when a job was queued."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from chattts_velocity.serve.text_work import LONG_TEXT_CHARS, TextWorker
from chattts_velocity.speech import SynthesisJob
from chattts_velocity.text import Normalizer
from chattts_velocity.text.budget import TextBudgetExceeded


class FakeFrontEnd:
    def __init__(self) -> None:
        self.normalizer = Normalizer()


class FakePipeline:
    """SpeechPipeline.pieces on the default normaliser, without weights."""

    def __init__(self) -> None:
        self.frontend = FakeFrontEnd()

    def pieces(self, job: SynthesisJob):
        from chattts_velocity.text import normalized_pieces

        o = job.text
        return normalized_pieces(job.texts, lambda p: self.frontend.normalizer(p, o.normalize, o.homophones, o.lang),
                                 o.split)


def test_a_long_text_reads_the_same_in_the_worker_process_and_a_dead_worker_is_replaced() -> None:
    pytest.importorskip("wetext")
    pipeline, worker = FakePipeline(), TextWorker(workers=1, budget_s=60, processes=1)
    job = SynthesisJob(["On 3/5/2024 we paid $3.50 for 12 apples. " * (LONG_TEXT_CHARS // 40 + 1)])
    try:
        in_process = asyncio.run(worker.split(pipeline, job))
        assert in_process == pipeline.pieces(job)
        for pid in list(worker._processes._processes):
            os.kill(pid, signal.SIGKILL)
        assert asyncio.run(worker.split(pipeline, job)) == in_process  # on a thread this once
        assert asyncio.run(worker.split(pipeline, job)) == in_process  # new workers
    finally:
        worker.shutdown()


def test_the_budget_counts_from_when_the_job_was_queued() -> None:
    worker = TextWorker(workers=1, budget_s=0.2)

    def slow_then_check() -> None:
        import time

        from chattts_velocity.text.budget import check_budget

        time.sleep(0.3)
        check_budget()

    async def both() -> list:
        from chattts_velocity.text.budget import check_budget

        return await asyncio.gather(worker.run(slow_then_check), worker.run(check_budget), worker.run(lambda: "ok"),
                                    return_exceptions=True)

    try:
        first, queued, unchecked = asyncio.run(both())
        # the second job waited 0.3 s behind the first: its budget was spent before it began
        assert isinstance(first, TextBudgetExceeded) and isinstance(queued, TextBudgetExceeded)
        assert unchecked == "ok"
    finally:
        worker.shutdown()
