"""The server's text work off the event loop: long texts in a worker process read as on a thread, a dead worker
is replaced, the budget is the job's own CPU time, and a cancelled job ends."""
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


class FakeStages:
    """Stages.pieces on the default normaliser, without weights."""

    def __init__(self) -> None:
        self.frontend = FakeFrontEnd()

    def pieces(self, job: SynthesisJob):
        from chattts_velocity.text import normalized_pieces

        o = job.text
        return normalized_pieces(job.texts, lambda p: self.frontend.normalizer(p, o.normalize, o.homophones, o.lang),
                                 o.split)


def test_a_long_text_reads_the_same_in_the_worker_process_and_a_dead_worker_is_replaced() -> None:
    pytest.importorskip("wetext")
    stages, worker = FakeStages(), TextWorker(workers=1, budget_s=60, processes=1)
    job = SynthesisJob(["On 3/5/2024 we paid $3.50 for 12 apples. " * (LONG_TEXT_CHARS // 40 + 1)])
    try:
        in_process = asyncio.run(worker.split(stages, job))
        assert in_process == stages.pieces(job)
        for pid in list(worker._processes._processes):
            os.kill(pid, signal.SIGKILL)
        assert asyncio.run(worker.split(stages, job)) == in_process  # on a thread this once
        assert asyncio.run(worker.split(stages, job)) == in_process  # new workers
    finally:
        worker.shutdown()


def test_the_budget_is_the_job_s_cpu_time_not_its_wait() -> None:
    """A job queued behind a slow one, or waiting without using the CPU, is not failed for it; a job that spends
    the CPU past its budget is."""
    import time

    from chattts_velocity.text.budget import check_budget

    worker = TextWorker(workers=1, budget_s=0.2)

    def sleep_then_check() -> str:
        time.sleep(0.4)  # wall time, no CPU
        check_budget()
        return "slept"

    def spin() -> None:
        while True:
            check_budget()

    async def jobs() -> list:
        return await asyncio.gather(worker.run(sleep_then_check), worker.run(check_budget), worker.run(spin),
                                    return_exceptions=True)

    try:
        slept, queued, spun = asyncio.run(jobs())
        assert slept == "slept" and queued is None and isinstance(spun, TextBudgetExceeded)
        assert "CPU time" in str(spun)
    finally:
        worker.shutdown()


def test_a_cancelled_job_ends_at_its_next_check() -> None:
    import threading
    import time

    from chattts_velocity.text.budget import TextWorkCancelled, check_budget

    worker, started, ended = TextWorker(workers=1, budget_s=60), threading.Event(), []

    def wait_checking() -> None:
        started.set()
        try:
            while True:
                check_budget()
                time.sleep(0.01)
        except TextWorkCancelled as exc:
            ended.append(exc)

    async def cancel_it() -> None:
        task = asyncio.ensure_future(worker.run(wait_checking))
        await asyncio.to_thread(started.wait)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.get_running_loop().run_in_executor(worker._threads, lambda: None)  # after the job's end

    try:
        asyncio.run(cancel_it())
        assert len(ended) == 1
    finally:
        worker.shutdown()
