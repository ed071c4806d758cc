"""Calls asked for in one event-loop turn, sent together at the end of that turn.

Invariants:
  * Without `linger_seconds` (the default) there is no timer: an item submitted in a turn is sent
    at the end of that same turn (with the others of the turn), unless `parallel` sends are in
    flight; items submitted while they all are wait, and go together when one returns. An item
    never waits for later ones. With `linger_seconds`, the first item of a send waits that long
    for others, and goes at once when `max_batch` are waiting or when `ready(waiting, sent)`
    (the items waiting, and those sent but not yet answered) says no other can come.
  * A send carries at most `max_batch` items, in submission order.
  * A send of one item runs in its submitter's context (its span stays in the submitter's
    trace); a send of several runs in a fresh context: it is no one's child.
  * Each submitter gets its own item's result, or the exception the send gave for it. A send that
    raises hands its exception to every submitter of that send: no failure leaves one waiting.
  * An item whose submitter stopped waiting (cancelled) before its send is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

SendBatch = Callable[[list[Item]], Awaitable[Sequence[Result | BaseException]]]
Ready = Callable[[int, int], bool]


@dataclass
class _Waiting(Generic[Item, Result]):
    item: Item
    future: asyncio.Future[Result] = field(repr=False)
    context: contextvars.Context = field(repr=False)


class TurnBatcher(Generic[Item, Result]):
    """Sends the items of one loop turn together with `send`, which answers each item in order."""

    def __init__(
        self,
        send: SendBatch[Item, Result],
        *,
        max_batch: int,
        parallel: int,
        linger_seconds: float = 0.0,
        ready: Ready | None = None,
    ) -> None:
        self._send_batch = send
        self._linger = max(0.0, linger_seconds)
        self._ready = ready
        self._timer: asyncio.TimerHandle | None = None
        self._items_in_flight = 0
        self._max_batch = max(1, max_batch)
        self._parallel = max(1, parallel)
        self._in_flight = 0
        self._starting = 0  # items of sends created that have not begun
        self._flush_scheduled = False
        self._waiting: list[_Waiting[Item, Result]] = []
        self._sends: set[asyncio.Future[None]] = set()

    @property
    def waiting(self) -> int:
        """Items submitted whose send has not started yet (their submitters still waiting)."""
        return sum(not each.future.done() for each in self._waiting) + self._starting

    async def submit(self, item: Item) -> Result:
        """Queue `item` for this turn's send; return its result (or raise its exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting.append(_Waiting(item, future, contextvars.copy_context()))
        if self._linger and self._no_more_coming():
            loop.call_soon(self._flush)  # a full batch, or all there will be, does not linger
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            if self._linger:
                self._timer = loop.call_later(self._linger, self._flush)
            else:
                loop.call_soon(self._flush)
        return await future

    def _no_more_coming(self) -> bool:
        waiting = len(self._waiting)
        if waiting >= self._max_batch:
            return True
        return self._ready is not None and self._ready(waiting, self._items_in_flight)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting = [each for each in self._waiting if not each.future.done()]
        while self._waiting and self._in_flight < self._parallel:
            batch = self._waiting[: self._max_batch]
            self._waiting = self._waiting[self._max_batch :]
            self._in_flight += 1
            self._items_in_flight += len(batch)
            self._starting += len(batch)
            context = batch[0].context if len(batch) == 1 else contextvars.Context()
            send = asyncio.get_running_loop().create_task(self._send(batch), context=context)
            self._sends.add(send)
            send.add_done_callback(self._sends.discard)

    async def _send(self, batch: list[_Waiting[Item, Result]]) -> None:
        self._starting -= len(batch)
        results: Sequence[Result | BaseException]
        try:
            results = await self._send_batch([each.item for each in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
        except Exception as exc:  # never leave a submitter waiting for an answer that won't come
            results = [exc] * len(batch)
        try:
            for each, result in zip(batch, results, strict=True):
                if each.future.done():
                    continue
                if isinstance(result, BaseException):
                    each.future.set_exception(result)
                else:
                    each.future.set_result(result)
        finally:
            self._in_flight -= 1
            self._items_in_flight -= len(batch)
            if self._timer is None or self._no_more_coming():  # else the linger's timer sends
                self._flush()
