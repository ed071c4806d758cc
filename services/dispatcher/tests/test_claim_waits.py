"""The waiters of `claim_waits`, without a database: which waiting claim a notification wakes, and
that one heard while every waiter of its queue was claiming is not lost."""

from __future__ import annotations

import asyncio

from taskplat.dispatcher.claim_waits import QueuedListener


def _listener() -> QueuedListener:
    return QueuedListener("postgresql://unused")  # never started: no connection is made


def test_a_notification_wakes_the_longest_waiting_claim_of_its_queue_only() -> None:
    async def scenario() -> None:
        listener = _listener()
        with listener.waiter("q") as first, listener.waiter("q") as second:
            with listener.waiter("other") as other:
                assert listener.wake("q")
                assert await first.wait(0.0, None)
                assert not await second.wait(0.0, None)
                assert not await other.wait(0.0, None)
                assert listener.waiting("q") == 2
        assert listener.waiting("q") == 0
        assert not listener.wake("q")  # nobody waits

    asyncio.run(scenario())


def test_a_notification_heard_while_every_waiter_claims_is_kept_for_the_next_wait() -> None:
    async def scenario() -> None:
        listener = _listener()
        with listener.waiter("q") as only:
            assert listener.wake("q")  # woken: it claims now, out of the queue of waiters
            assert await only.wait(0.0, None)
            assert not listener.wake("q")  # a second task commits during that claim
            listener.rearm(only)  # its claim found nothing: it looks again at once
            assert await only.wait(0.0, None)
            listener.rearm(only)  # nothing was missed this time: it waits
            assert not await only.wait(0.01, None)
        # A claim that registers later claims first anyway: nothing kept for it.
        assert not listener.wake("q")
        with listener.waiter("q") as later:
            listener.rearm(later)
            assert not await later.wait(0.0, None)

    asyncio.run(scenario())


def test_a_waiter_whose_client_went_away_stops_waiting() -> None:
    async def scenario() -> None:
        listener = _listener()
        gone: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        with listener.waiter("q") as waiter:
            asyncio.get_running_loop().call_soon(gone.set_result, None)
            assert not await waiter.wait(30.0, gone)  # ends with the client, not woken
            assert gone.done()

    asyncio.run(scenario())
