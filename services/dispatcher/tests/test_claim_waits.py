"""The waiters of `claim_waits`, without a database: which waiting claim a notification wakes, that
one heard while every waiter of its queue was claiming is not lost, and that a waiting claim a
create took is answered what the create claimed for it, never left behind."""

from __future__ import annotations

import asyncio

from taskplat.dispatcher.claim_waits import QueuedListener, Waiter


def _listener() -> QueuedListener:
    return QueuedListener("postgresql://unused")  # never started: no connection is made


async def _woken(waiter: Waiter, timeout: float) -> bool:
    assert await waiter.wait(timeout) is None  # nothing claimed for it
    return waiter.woken


async def _until_in_wait(waiter: Waiter) -> None:
    for _ in range(100):  # it enters its wait in the first turns of its task
        if waiter.in_wait:
            return
        await asyncio.sleep(0)
    raise AssertionError("the waiter never entered its wait")


def test_a_notification_wakes_the_longest_waiting_claim_of_its_queue_only() -> None:
    async def scenario() -> None:
        listener = _listener()
        with listener.waiter("q") as first, listener.waiter("q") as second:
            with listener.waiter("other") as other:
                assert listener.wake("q")
                assert await _woken(first, 0.0)
                assert not await _woken(second, 0.0)
                assert not await _woken(other, 0.0)
                assert listener.waiting("q") == 2
        assert listener.waiting("q") == 0
        assert not listener.wake("q")  # nobody waits

    asyncio.run(scenario())


def test_a_notification_heard_while_every_waiter_claims_is_kept_for_the_next_wait() -> None:
    async def scenario() -> None:
        listener = _listener()
        with listener.waiter("q") as only:
            assert listener.wake("q")  # woken: it claims now, out of the queue of waiters
            assert await _woken(only, 0.0)
            assert not listener.wake("q")  # a second task commits during that claim
            listener.rearm(only)  # its claim found nothing: it looks again at once
            assert await _woken(only, 0.0)
            listener.rearm(only)  # nothing was missed this time: it waits
            assert not await _woken(only, 0.01)
        # A claim that registers later claims first anyway: nothing kept for it.
        assert not listener.wake("q")
        with listener.waiter("q") as later:
            listener.rearm(later)
            assert not await _woken(later, 0.0)

    asyncio.run(scenario())


def test_a_waiter_whose_client_went_away_stops_waiting() -> None:
    async def scenario() -> None:
        listener = _listener()
        gone: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        with listener.waiter("q", gone=gone) as waiter:
            asyncio.get_running_loop().call_soon(gone.set_result, None)
            assert not await _woken(waiter, 30.0)  # ends with the client, not woken
            assert gone.done()

    asyncio.run(scenario())


def test_a_create_takes_only_a_claim_inside_its_wait_and_hands_it_what_it_claimed() -> None:
    async def scenario() -> None:
        listener = _listener()
        listener.listening = True
        with listener.waiter("q", "w-1", 4) as waiter:
            assert listener.take("q") is None  # registered, still in its first claim
            waiting = asyncio.ensure_future(waiter.wait(30.0))
            await _until_in_wait(waiter)
            assert listener.take("q") is waiter
            assert (waiter.worker_id, waiter.limit) == ("w-1", 4)
            assert listener.take("q") is None  # out of the line while taken
            assert not listener.wake("q")  # a notification meanwhile wakes no taken claim
            waiter.hand([{"task_id": "t"}])
            assert await waiting == [{"task_id": "t"}] and waiter.woken

    asyncio.run(scenario())


def test_a_taken_claim_outlasts_its_deadline_and_its_client_until_handed() -> None:
    async def scenario() -> None:
        listener = _listener()
        listener.listening = True
        gone: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        with listener.waiter("q", gone=gone) as waiter:
            waiting = asyncio.ensure_future(waiter.wait(0.01))
            await _until_in_wait(waiter)
            assert listener.take("q") is waiter
            gone.set_result(None)
            # Past the wait's deadline and the client's going, it still waits for the hand.
            done, _ = await asyncio.wait({waiting}, timeout=0.05)
            assert not done
            waiter.hand([{"task_id": "t"}])
            assert await waiting == [{"task_id": "t"}]

    asyncio.run(scenario())


def test_a_create_that_claimed_nothing_wakes_the_claim_and_skips_a_gone_client() -> None:
    async def scenario() -> None:
        listener = _listener()
        listener.listening = True
        gone: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        with listener.waiter("q", gone=gone) as left, listener.waiter("q") as stays:
            waits = [asyncio.ensure_future(each.wait(30.0)) for each in (left, stays)]
            await _until_in_wait(left)
            await _until_in_wait(stays)
            gone.set_result(None)
            assert listener.take("q") is stays  # the longest waiting one's client went away
            stays.hand(None)  # nothing claimed for it: it claims for itself, as if notified
            assert await waits[1] is None and stays.woken
            assert await waits[0] is None and not left.woken
        listener.listening = False
        with listener.waiter("q") as unheard:
            waiting = asyncio.ensure_future(unheard.wait(0.05))
            await _until_in_wait(unheard)
            assert listener.take("q") is None  # not listening: creates NOTIFY as before
            assert await waiting is None

    asyncio.run(scenario())
