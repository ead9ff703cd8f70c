"""Who holds an engine index (docs/design.md, handshake): a stranger never evicts a live engine, and a restarted
engine is taken back at once.

A hello from a new incarnation for an index whose current engine holds it (:meth:`Liveness.holds_index
<openinfer.frontend.engines.liveness.Liveness.holds_index>`: up, heard within the timeout, its connection
open) is contested. It waits, unanswered, until one of two things happens:

- the current engine proves alive: a message of it is read at least ``DISCONNECT_PROBE_QUIET_S`` after the
  contested hello (earlier ones may have been sent before that hello: the frontend can lag behind its
  socket). The newcomer is refused (by the handshake: ``HelloRefused`` is sent to it, it is counted in
  ``openinfer:engine_hellos_refused_total{reason="engine_alive"}`` and retired, so that its outputs are
  protocol errors, never merged) and a warning logged. A live engine heart-beats every second, so a
  stranger waits about that.
- the current engine stops holding it: its connection closes (a restarted engine's predecessor, whose
  close the frontend may read just after the new hello), or it is silent past the timeout. The newcomer is
  taken, as a restart.

The wait is the same rule as the liveness probe's, so a restart is never mistaken for a stranger because
the frontend read the new hello before the old connection's close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from openinfer.frontend.engines.liveness import DISCONNECT_PROBE_QUIET_S, TICK_S, Liveness
from openinfer.frontend.engines.registry import EngineRecord, EngineRegistry, kept_hello
from openinfer.frontend.log_limit import LogRateLimiter
from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import EngineHello, engine_identity

logger = logging.getLogger(__name__)

_MAX_CONTESTED = 64  # contested hellos waiting at once; past it a contested hello is refused at once

# Refuses a hello: (hello, reason, message) - retired, counted under reason, told message.
Refuse = Callable[[EngineHello, str, str], Awaitable[None]]
# Makes a hello's incarnation the current one of its index.
Join = Callable[[EngineHello, Tokenizer, int | None], None]


@dataclass
class ContestedHello:
    """A hello for an index a live engine holds, waiting for the verdict."""

    hello: EngineHello  # its latest hello (an engine asked again repeats it), without the tokenizer files
    tokenizer: Tokenizer
    fd: int | None  # the descriptor of the connection it came over
    arrived: float  # time.monotonic() when its first hello was read


class IndexClaims:
    """The contested hellos and their verdicts, taken when one comes and every liveness tick."""

    def __init__(self, registry: EngineRegistry, liveness: Liveness, refuse: Refuse, join: Join) -> None:
        self._registry = registry
        self._liveness = liveness
        self._refuse_hello = refuse
        self._join = join
        self._contested: dict[bytes, ContestedHello] = {}  # by engine identity
        self._log = LogRateLimiter(logger)

    async def claim(self, hello: EngineHello, tokenizer: Tokenizer, fd: int | None) -> bool:
        """A hello from an incarnation that is not its index's current one: True when it may join now;
        False when it waits (it is joined later, or refused) or is refused now."""
        now = time.monotonic()
        identity = engine_identity(hello.engine_index, hello.incarnation)
        holder = self._registry.get(hello.engine_index)
        if holder is None or not self._liveness.holds_index(holder, now):
            self._contested.pop(identity, None)
            return True
        contested = self._contested.get(identity)
        if contested is not None:
            contested.hello, contested.tokenizer, contested.fd = kept_hello(hello), tokenizer, fd
            return False
        if len(self._contested) >= _MAX_CONTESTED:
            await self._refuse(hello, holder, now)
            return False
        self._contested[identity] = ContestedHello(kept_hello(hello), tokenizer, fd, now)
        self._log.info(
            "contested",
            "engine %d: a hello from incarnation %016x while %s holds the index; it is refused if that "
            "engine is heard from again, taken if it is gone",
            hello.engine_index,
            hello.incarnation,
            holder.describe(),
        )
        return False

    def is_contested(self, engine_index: int, incarnation: int) -> bool:
        """Whether this incarnation's hello waits for a verdict (its other messages are dropped meanwhile)."""
        return engine_identity(engine_index, incarnation) in self._contested

    async def decide(self, now: float) -> None:
        """Join each contested hello whose index is no longer held; refuse those whose holder proved alive."""
        for identity, contested in list(self._contested.items()):
            hello = contested.hello
            holder = self._registry.get(hello.engine_index)
            if holder is None or not self._liveness.holds_index(holder, now):
                del self._contested[identity]
                self._join(hello, contested.tokenizer, contested.fd)
            elif holder.last_seen - contested.arrived >= DISCONNECT_PROBE_QUIET_S:
                del self._contested[identity]
                await self._refuse(hello, holder, now)

    async def run(self) -> None:
        """Take the verdicts every liveness tick until cancelled."""
        while True:
            await asyncio.sleep(TICK_S)
            await self.decide(time.monotonic())

    async def _refuse(self, hello: EngineHello, holder: EngineRecord, now: float) -> None:
        index, incarnation = hello.engine_index, hello.incarnation
        message = (
            f"engine index {index} is held by a live engine (incarnation {holder.incarnation:016x}, heard "
            f"from {now - holder.last_seen:.1f} s ago); a second engine with the same index never replaces "
            "it: give this engine another --engine-index, or stop the other one first"
        )
        self._log.warning(
            "engine_alive",
            "refused a hello from engine %d incarnation %016x: %s",
            index,
            incarnation,
            message,
        )
        await self._refuse_hello(hello, "engine_alive", message)
