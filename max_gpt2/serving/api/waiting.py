"""How a route waits: several choices' streams read side by side, and work stopped where its client
leaves (MAX's middleware then answers 499)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request

from max_gpt2.max_internals import client_left

T = TypeVar("T")


async def side_by_side(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several async iterators as each comes, with the index of its source; all of them
    stopped if the reader stops."""
    if len(sources) == 1:
        async for item in sources[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    done = object()

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                await queue.put((index, item, None))
            await queue.put((index, done, None))
        except Exception as error:
            await queue.put((index, done, error))

    tasks = [asyncio.create_task(pump(index, source)) for index, source in enumerate(sources)]
    try:
        running = len(tasks)
        while running:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is done:
                running -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; if the client hangs up first, `work` is cancelled (which stops its choices) and
    MAX's middleware answers 499 (`client_left`). Reads the request's messages: only once its body has
    been read."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for each in (task, watch):
            if not each.done():
                each.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
    if task not in done:  # not `task.cancelled()`: a cancelled `gather` holds a CancelledError instead
        raise client_left()
    return task.result()


async def disconnected(request: Request) -> None:
    """Returns once the client has hung up."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
