"""Bounded waits for the frontend tests: a condition polled until it holds, or the test fails; and whether a
worker process the frontend started is still there."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` every 10 ms; fail the test if it is not true within ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.01)


def alive(pid: int) -> bool:
    """Whether the process exists (a killed worker is waited for, so it does not linger as a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
