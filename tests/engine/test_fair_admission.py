"""Admission takes turns between clients: a client with many queued requests shares the batch with one that sends
a single request, queue order holds within a client, and one client alone is served first come, first served."""
from __future__ import annotations

import asyncio

from fakes import ScriptedRunner, make_scheduler, make_seqs, run

from chattts_velocity.engine.async_engine import CLIENT, AsyncLLMEngine, ClientBusy


def tagged(client: str, n: int, start: int = 0, **params):
    seqs = make_seqs(start + n, max_new_token=params.pop("max_new_token", 5), **params)[start:]
    for seq in seqs:
        seq.request_id, seq.client = f"{client}-{seq.request_id}", client
    return seqs


def finish_steps(sched) -> dict[str, int]:
    """Request id -> the step at which it finished."""
    finished: dict[str, int] = {}

    def record(step, _sched, batch) -> None:
        finished.update((seq.request_id, step) for seq in batch.seqs if seq.is_finished and seq.request_id
                        not in finished)

    run(sched, ScriptedRunner(), on_step=record)
    return finished


def test_a_late_single_request_is_admitted_at_the_next_free_seat() -> None:
    sched = make_scheduler(max_num_seqs=4)
    heavy = tagged("heavy", 40)
    for seq in heavy:
        sched.add(seq)
    sched.schedule()  # heavy fills the four seats
    light = tagged("light", 1, start=40)[0]
    sched.add(light)
    done = finish_steps(sched)
    assert done[light.request_id] <= 2 * 5 + 1  # one request's length after a seat frees, not after 40 requests
    heavy_order = sorted((done[s.request_id], int(s.request_id.rsplit("-", 1)[1])) for s in heavy)
    assert [n for _, n in heavy_order] == sorted(n for _, n in heavy_order)  # queue order within the client


def test_one_client_alone_is_first_come_first_served() -> None:
    sched = make_scheduler(max_num_seqs=3)
    seqs = tagged("only", 9)
    for seq in seqs:
        sched.add(seq)
    done = finish_steps(sched)
    assert sorted(done, key=lambda rid: (done[rid], int(rid.rsplit("-", 1)[1]))) == [s.request_id for s in seqs]


def test_two_busy_clients_share_the_seats_evenly() -> None:
    sched = make_scheduler(max_num_seqs=4)
    for seq in tagged("a", 20) + tagged("b", 20, start=20):  # a's all queued before b's
        sched.add(seq)
    batch = sched.schedule()
    assert sorted(seq.client for seq in batch.seqs) == ["a", "a", "b", "b"]


def test_the_async_engine_tags_requests_with_the_caller_s_client(monkeypatch) -> None:
    seen: list[str] = []

    class Engine:
        stats = type("Stats", (), {"num_steps": 0})()

        def add_request(self, request_id, prompt, params, client=""):
            seen.append(client)
            raise ValueError("refused after recording")

        def has_unfinished_requests(self) -> bool:
            return False

    engine = AsyncLLMEngine(Engine())

    async def send(client: str) -> None:
        CLIENT.set(client)
        try:
            await engine.add_request(None, None)
        except ValueError:
            pass

    async def both() -> None:
        await asyncio.gather(send("key:abc"), send("addr:127.0.0.1"))

    try:
        asyncio.run(both())
    finally:
        engine.shutdown()
    assert sorted(seen) == ["addr:127.0.0.1", "key:abc"]


class QueueingEngine:
    """Accepts every request and never finishes one."""

    stats = type("Stats", (), {"num_steps": 0})()

    def __init__(self) -> None:
        self.added: list[str] = []

    def add_request(self, request_id, prompt, params, client=""):
        self.added.append(client)

    def abort_request(self, request_id) -> bool:
        return True

    def has_unfinished_requests(self) -> bool:
        return False


def test_a_client_over_its_queue_cap_is_refused_and_others_are_not() -> None:
    engine = AsyncLLMEngine(QueueingEngine(), max_queued_per_client=2)

    async def scenario():
        CLIENT.set("key:heavy")
        streams = [await engine.add_request(None, None) for _ in range(2)]
        try:
            await engine.add_request(None, None)
        except ClientBusy as exc:
            refused = exc
        CLIENT.set("addr:10.0.0.2")
        await engine.add_request(None, None)  # another client still gets in
        engine.abort(streams[0].request_id)  # a finished or aborted request frees its place
        await asyncio.sleep(0.05)
        CLIENT.set("key:heavy")
        await engine.add_request(None, None)
        return refused

    try:
        refused = asyncio.run(scenario())
    finally:
        engine.shutdown()
    assert str(refused).startswith("input: this client has 2 pieces unfinished") and refused.status == 429
    assert engine.engine.added == ["key:heavy", "key:heavy", "addr:10.0.0.2", "key:heavy"]
