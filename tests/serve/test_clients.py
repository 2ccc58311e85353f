"""Who a request is from (serve/clients.py): what a client cannot choose. Keyless, the peer address (a bearer token
names nobody; X-Forwarded-For only from a proxy the operator named); keyed, (key, peer) with the key's own caps;
a keys file; and counters that forget a client once it has nothing left."""
from __future__ import annotations

import asyncio

import pytest

from chattts_velocity.engine.client_quota import CLIENT, QUOTAS, QuotaBook
from chattts_velocity.serve.clients import Clients, KeyLimits, read_keys_file
from chattts_velocity.serve.fair_turns import FairTurns
from chattts_velocity.serve.intake import Admission


def scope(peer: str) -> dict:
    return {"type": "http", "client": (peer, 5000)}


def test_keyless_a_client_is_its_peer_whatever_token_it_sends() -> None:
    clients = Clients({}, 8)
    a = clients.identify(scope("10.0.0.1"), {"authorization": "Bearer A"})
    b = clients.identify(scope("10.0.0.1"), {"authorization": "Bearer B"})
    other = clients.identify(scope("10.0.0.2"), {"authorization": "Bearer A"})
    assert a == b and a.name == "addr:10.0.0.1" and a.quotas == (("addr:10.0.0.1", 8),) and a.authorized
    assert other.name != a.name


def test_x_forwarded_for_counts_only_from_a_trusted_proxy() -> None:
    forged = {"x-forwarded-for": "1.1.1.1"}
    assert Clients({}, 8).identify(scope("10.0.0.1"), forged).name == "addr:10.0.0.1"
    proxied = Clients({}, 8, trusted_proxies=("10.0.0.5", "10.0.0.6"))
    assert proxied.identify(scope("10.0.0.1"), forged).name == "addr:10.0.0.1"  # not from the proxy
    # the proxy appends the address it saw: what a client wrote to the left of it is not believed
    chain = {"x-forwarded-for": "9.9.9.9, 2.2.2.2, 10.0.0.6"}
    assert proxied.identify(scope("10.0.0.5"), chain).name == "addr:2.2.2.2"
    assert proxied.identify(scope("10.0.0.5"), {"x-forwarded-for": "not-an-ip"}).name == "addr:10.0.0.5"
    with pytest.raises(ValueError, match="^trusted_proxies: 'proxy' is not an IP address"):
        Clients({}, 8, trusted_proxies=("proxy",))


def test_with_keys_a_client_is_its_key_and_its_peer_with_the_key_s_caps() -> None:
    clients = Clients({"k1": KeyLimits(max_queued=30, max_queued_per_peer=10), "k2": KeyLimits()}, 8)
    one = clients.identify(scope("10.0.0.1"), {"authorization": "Bearer k1"})
    two = clients.identify(scope("10.0.0.2"), {"authorization": "bearer k1 "})
    assert one.authorized and one.name != two.name and "k1" not in one.name
    key = one.quotas[1][0]
    assert one.quotas == ((one.name, 10), (key, 30)) and two.quotas == ((two.name, 10), (key, 30))
    assert clients.identify(scope("10.0.0.1"), {"authorization": "Bearer k2"}).quotas[0][1] == 8
    assert not clients.identify(scope("10.0.0.1"), {"authorization": "Bearer k3"}).authorized
    assert not clients.identify(scope("10.0.0.1"), {}).authorized


def test_a_key_s_cap_holds_over_all_its_peers_and_a_peer_s_over_itself() -> None:
    clients = Clients({"k": KeyLimits(max_queued=3, max_queued_per_peer=2)}, 8)
    one, two, three = (clients.identify(scope(f"10.0.0.{i}"), {"authorization": "Bearer k"}) for i in (1, 2, 3))
    book = QuotaBook()
    book.count("a", one.quotas)
    book.count("b", one.quotas)
    assert book.busy(one.quotas) is not None and book.busy(two.quotas) is None  # a peer's cap is its own
    book.count("c", two.quotas)
    assert "this API key has 3" in str(book.busy(three.quotas))  # the key's cap is everyone's
    for request in "abc":
        book.release(request)
    assert len(book) == 0  # nothing left: no record of any client


def test_the_keys_file(tmp_path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\nalpha max_queued=40\n\nbeta max_queued=10 max_queued_per_peer=2  # ci\n")
    assert read_keys_file(path) == {"alpha": KeyLimits(max_queued=40), "beta": KeyLimits(10, 2)}
    for bad in ("alpha speed=3\n", "alpha max_queued=0\n", "alpha\nalpha\n", "# nothing\n"):
        path.write_text(bad)
        with pytest.raises(ValueError, match="^api_keys_file: ") as error:
            read_keys_file(path)
        assert "alpha" not in str(error.value)  # a key is never echoed


def test_fair_turns_serve_a_newcomer_before_a_flooder_s_queue() -> None:
    async def scenario() -> list[str]:
        turns, order = FairTurns(1), []

        async def job(client: str, tag: str, hold: asyncio.Event | None = None) -> None:
            async with turns.turn(client):
                order.append(tag)
                if hold is not None:
                    await hold.wait()

        release = asyncio.Event()
        first = asyncio.create_task(job("flood", "f0", release))
        await asyncio.sleep(0)
        floods = [asyncio.create_task(job("flood", f"f{i}")) for i in range(1, 4)]
        await asyncio.sleep(0)
        gone = asyncio.create_task(job("gone", "never"))
        newcomer = asyncio.create_task(job("bystander", "b"))
        await asyncio.sleep(0)
        gone.cancel()  # a job whose client left leaves the queue
        release.set()
        await asyncio.gather(first, *floods, newcomer)
        assert not turns.running and not turns._waiting and not turns._served
        return order

    assert asyncio.run(scenario()) == ["f0", "b", "f1", "f2", "f3"]


def test_admission_refuses_a_client_at_its_caps_before_any_work_and_forgets_it_after() -> None:
    class Engine:
        max_queued_per_client = 2
        quota_book = QuotaBook()

    async def scenario() -> None:
        admission = Admission(Engine(), max_preparing=1)  # type: ignore[arg-type]
        CLIENT.set("addr:10.0.0.1")
        QUOTAS.set((("addr:10.0.0.1", 2),))
        async with admission.admitted():
            with pytest.raises(ValueError, match="requests being prepared") as busy:
                async with admission.admitted():
                    pass
            assert getattr(busy.value, "status", None) == 429
        assert not admission.preparing
        Engine.quota_book.count("p1", (("addr:10.0.0.1", 2),))
        Engine.quota_book.count("p2", (("addr:10.0.0.1", 2),))
        with pytest.raises(ValueError, match="pieces unfinished"):
            async with admission.admitted():
                pass

    asyncio.run(scenario())


def test_a_wait_cancelled_as_its_turn_comes_hands_the_slot_on() -> None:
    async def scenario() -> None:
        turns, order, release = FairTurns(1), [], asyncio.Event()

        async def job(client: str) -> None:
            async with turns.turn(client):
                order.append(client)
                await release.wait()

        holder = asyncio.create_task(job("a"))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(job(c)) for c in ("b", "c")]
        await asyncio.sleep(0)
        waiting[0].cancel()  # its wake-up is cancelled before the holder's release comes to grant it
        release.set()
        await asyncio.gather(holder, waiting[1])
        assert order == ["a", "c"] and not turns.running and not turns._served and not turns._waiting

    asyncio.run(scenario())


def test_a_client_holds_at_most_half_the_slots_so_a_newcomer_finds_one_free() -> None:
    async def scenario() -> list[str]:
        turns, order, release = FairTurns(2), [], asyncio.Event()

        async def job(client: str, tag: str) -> None:
            async with turns.turn(client):
                order.append(tag)
                await release.wait()

        floods = [asyncio.create_task(job("flood", f"f{i}")) for i in range(3)]
        await asyncio.sleep(0)
        newcomer = asyncio.create_task(job("bystander", "b"))
        await asyncio.sleep(0)
        started = list(order)  # before anything ends
        release.set()
        await asyncio.gather(*floods, newcomer)
        return started

    assert asyncio.run(scenario()) == ["f0", "b"]
