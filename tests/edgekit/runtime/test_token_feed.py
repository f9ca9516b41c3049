"""The device thread -> event loop hand-off: nothing lost or reordered, and the loop is not woken per token."""

from __future__ import annotations

import asyncio
import threading
import time

from edgekit.runtime.token_feed import TokenFeed


def test_every_item_arrives_in_order_across_threads():
    async def main():
        feed = TokenFeed(asyncio.get_running_loop())
        chans = [feed.channel() for _ in range(4)]

        def device():  # 4 rows decoding together, 500 steps
            for step in range(500):
                for ch in chans:
                    ch.put("token", step)
            for ch in chans:
                ch.put("done", None)

        th = threading.Thread(target=device)
        th.start()

        async def consume(ch):
            got = []
            while True:
                for kind, value in await ch.get_batch():
                    if kind == "done":
                        return got
                    got.append(value)

        results = await asyncio.gather(*(consume(ch) for ch in chans))
        th.join()
        return feed, results

    feed, results = asyncio.run(main())
    assert all(r == list(range(500)) for r in results)
    assert feed.wakeups <= 4 * 501  # never more than one wake-up per item


def test_a_busy_loop_is_woken_once_for_everything_that_arrived_meanwhile():
    async def main():
        feed = TokenFeed(asyncio.get_running_loop())
        chans = [feed.channel() for _ in range(8)]
        th = threading.Thread(target=lambda: [ch.put("token", i) for i in range(50) for ch in chans])
        th.start()
        th.join()  # the loop is busy (here: blocked) while a whole batch of steps arrives
        time.sleep(0.01)
        batches = [await ch.get_batch() for ch in chans]
        return feed, batches

    feed, batches = asyncio.run(main())
    assert all([v for _, v in b] == list(range(50)) for b in batches)
    assert feed.wakeups == 1  # 400 items, one wake-up of the loop


def test_a_put_after_the_loop_closed_is_dropped_quietly():
    loop = asyncio.new_event_loop()
    feed = TokenFeed(loop)
    ch = feed.channel()
    loop.close()
    ch.put("token", 1)  # the server is shutting down while the device thread finishes a step
