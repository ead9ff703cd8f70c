"""Drafter commands (load, unload) sent to one engine, each awaited until the engine's reply."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from openinfer.frontend.engines.errors import EngineCommandError, NoEngineError
from openinfer.frontend.engines.registry import EngineRecord, EngineRegistry
from openinfer.protocol import DrafterReply, EngineInput, LoadDrafter, UnloadDrafter

# Sends one message to one engine identity, retrying for the given seconds while it is unroutable.
Send = Callable[[bytes, EngineInput, float], Awaitable[bool]]


class DrafterCommands:
    """The commands awaiting a reply live on their engine's record (``record.commands``, by command id)."""

    def __init__(self, registry: EngineRegistry, send: Send, send_patience_s: float) -> None:
        self._registry = registry
        self._send = send
        self._patience_s = send_patience_s

    async def run(
        self, engine_index: int, command: LoadDrafter | UnloadDrafter, timeout: float
    ) -> DrafterReply:
        """Send a drafter command to a live engine and wait for its :class:`DrafterReply` (any ``ok``).

        Raises :class:`NoEngineError` for an unknown or down index, :class:`EngineCommandError` when the
        command cannot be sent or the engine restarts first, ``TimeoutError`` after ``timeout`` seconds.
        """
        record = self._registry.get(engine_index)
        if record is None or not record.up:
            known = ", ".join(str(r.index) for r in self._registry.live()) or "none"
            raise NoEngineError(f"engine {engine_index} is not connected (engines up: {known})")
        reply: asyncio.Future[DrafterReply] = asyncio.get_running_loop().create_future()
        record.commands[command.command_id] = reply
        try:
            if not await self._send(record.identity, command, self._patience_s):
                raise EngineCommandError(f"{record.describe()} is not connected to the request socket")
            async with asyncio.timeout(timeout):
                return await reply
        finally:
            record.commands.pop(command.command_id, None)

    @staticmethod
    def on_reply(record: EngineRecord, reply: DrafterReply) -> bool:
        """An engine's reply: its K now, and the answer to whoever awaits that command; False when no one
        awaits it now (it timed out, or never was: the caller logs it)."""
        record.num_spec_tokens = reply.num_spec_tokens
        waiter = record.commands.pop(reply.command_id, None)
        if waiter is None or waiter.done():
            return False
        waiter.set_result(reply)
        return True

    @staticmethod
    def end(record: EngineRecord, reason: str) -> None:
        """No answer will come (the engine restarted, the frontend closes): every waiter fails with why."""
        for waiter in record.commands.values():
            if not waiter.done():
                waiter.set_exception(EngineCommandError(reason))
        record.commands.clear()
