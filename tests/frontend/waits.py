"""Bounded waits for the frontend tests: a condition polled until it holds, or the test fails."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` every 10 ms; fail the test if it is not true within ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.01)
