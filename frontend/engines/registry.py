"""What the frontend knows about its engines: one current incarnation per engine index."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from openinfer.frontend.tokenizer import Tokenizer
from openinfer.protocol import DrafterReply, EngineHello, LoadSnapshot, engine_identity

# Request ids remembered per engine as aborted there (late outputs of requests that ended here).
_MAX_ABORTED_IDS = 4096
# Engine indices with a record at once; a hello for another index is refused ("too_many_engines"). Records
# of indices that joined and were never heard from again are forgotten, so only real engines stay.
MAX_ENGINES = 256
# A message whose seq does not go up may be a leftover of a closed connection, read after (and interleaved
# with) the new connection's messages when the engine reconnected (a frontend paused past the engines' ZMTP
# heartbeat): it is dropped. Such messages still coming STALE_GRACE_S after the first mean two processes send
# as the incarnation. A run of them ends STALE_RUN_GAP_S after the latest (an engine sends at least every 1 s).
STALE_GRACE_S = 1.0
STALE_RUN_GAP_S = 3.0


def kept_hello(hello: EngineHello) -> EngineHello:
    """A hello as it is kept once its tokenizer is built: without the tokenizer files (up to the frame size
    limit each; strangers can send many hellos)."""
    return msgspec.structs.replace(hello, tokenizer_json=b"", tokenizer_config_json=b"")


@dataclass
class EngineRecord:
    """One engine incarnation, from its hello until it is replaced; ``up`` is false while it is silent."""

    hello: EngineHello
    tokenizer: Tokenizer
    last_seen: float  # time.monotonic() of its latest message
    last_seq: int  # seq of its latest message; outputs must go strictly up
    load: LoadSnapshot  # from its latest message
    num_spec_tokens: int | None  # K of its drafter (None: no speculation), from the hello and drafter replies
    up: bool = True
    sent_since_snapshot: int = 0  # requests sent to it after its latest load snapshot
    commands: dict[str, asyncio.Future[DrafterReply]] = field(default_factory=dict)  # by command_id
    fd: int | None = None  # the frontend's fd of the connection its latest output came over
    # time.monotonic() when that connection closed; it must be heard from again soon after, or it is dead
    disconnected_at: float | None = None
    aborted: set[str] = field(default_factory=set)  # ids it sent outputs for after they ended here
    # a message other than a hello came from it: an index whose record never gets one is forgotten when
    # the record goes down (forged hellos, then silence, leave nothing behind)
    heard_after_hello: bool = False
    # time.monotonic() of the first and the latest message of the current run whose seqs did not go up
    stale_since: float | None = None
    stale_latest: float = 0.0

    @property
    def index(self) -> int:
        return self.hello.engine_index

    @property
    def incarnation(self) -> int:
        return self.hello.incarnation

    @property
    def identity(self) -> bytes:
        return engine_identity(self.hello.engine_index, self.hello.incarnation)

    @property
    def model_name(self) -> str:
        return self.hello.model_name

    @property
    def exports_metrics(self) -> bool:
        """Whether this frontend exports the engine's counters and gauges: it is the engine's metrics frontend
        (docs/design.md, several frontends); the others export only their own requests' metrics."""
        return self.hello.exports_metrics

    @property
    def load_score(self) -> int:
        """Requests it holds or will soon hold: the routing key (lower is better)."""
        return self.load.num_running_reqs + self.load.num_waiting_reqs + self.sent_since_snapshot

    def note_aborted(self, request_ids: list[str]) -> list[str]:
        """Remember these ids as aborted on this engine; returns those not remembered before."""
        new = [request_id for request_id in request_ids if request_id not in self.aborted]
        if len(self.aborted) + len(new) > _MAX_ABORTED_IDS:
            self.aborted.clear()
        self.aborted.update(new)
        return new

    def stale_for(self, now: float) -> float:
        """A message whose seq did not go up came at ``now``: for how long such messages have kept coming."""
        if self.stale_since is None or now - self.stale_latest > STALE_RUN_GAP_S:
            self.stale_since = now
        self.stale_latest = now
        return now - self.stale_since

    def describe(self) -> str:
        """A short human description for log lines and error messages."""
        return f"engine {self.index} (incarnation {self.incarnation:016x}, model {self.model_name!r})"


@dataclass(frozen=True)
class ServedModel:
    """A model name some live engine serves, with what the API needs to prepare requests for it."""

    name: str
    tokenizer: Tokenizer
    max_model_len: int  # the smallest over the live engines serving it
    vocab_size: int
    eos_token_ids: tuple[int, ...]


class Retirement(enum.Enum):
    """Why an incarnation's messages are ignored."""

    REPLACED = enum.auto()  # a new incarnation of its index joined
    REFUSED = enum.auto()  # its hello was refused: what it sends is a protocol error (kind "refused")
    CLASHED = enum.auto()  # two processes sent as it (its seqs clashed): refused as well, and kept apart


# Replaced and refused incarnations remembered, oldest forgotten first: a forgotten one's outputs get a
# HelloRequest. Strangers can make any number of them (a hello each), so the bound is theirs to reach.
_MAX_RETIRED = 4096
# Clashed incarnations remembered, kept apart so that no flood of hellos evicts one (what it sends would then
# get a HelloRequest instead of a refusal, and it could join again). Only a newer clash evicts one, and each
# takes a process sending as a current incarnation for STALE_GRACE_S.
_MAX_CLASHED = 4096


class EngineRegistry:
    """Engine records by index, and the incarnations that are over (replaced, refused or clashed)."""

    def __init__(self) -> None:
        self._records: dict[int, EngineRecord] = {}
        # (index, incarnation) -> why it is over, oldest first; clashes apart (see _MAX_CLASHED)
        self._retired: dict[tuple[int, int], Retirement] = {}
        self._clashed: dict[tuple[int, int], None] = {}

    def get(self, engine_index: int) -> EngineRecord | None:
        return self._records.get(engine_index)

    def current(self, engine_index: int, incarnation: int) -> EngineRecord | None:
        """The record of exactly this incarnation, if it is the current one (and not retired: a record whose
        incarnation two processes claimed stays, down, until its index has a new one)."""
        record = self._records.get(engine_index)
        if record is None or record.incarnation != incarnation or self.is_retired(engine_index, incarnation):
            return None
        return record

    def records(self) -> list[EngineRecord]:
        return [self._records[index] for index in sorted(self._records)]

    def live(self) -> list[EngineRecord]:
        return [record for record in self.records() if record.up]

    def install(self, record: EngineRecord) -> EngineRecord | None:
        """Make ``record`` its index's current incarnation; return the previous one, now retired."""
        previous = self._records.get(record.index)
        self._records[record.index] = record
        if previous is not None and previous.incarnation != record.incarnation:
            self.retire(previous.index, previous.incarnation, Retirement.REPLACED)
            return previous
        return None

    def has_room(self, engine_index: int) -> bool:
        """Whether a hello for ``engine_index`` may make a record: it has one, or there are fewer than
        :data:`MAX_ENGINES`."""
        return engine_index in self._records or len(self._records) < MAX_ENGINES

    def forget(self, engine_index: int) -> None:
        """Drop an index's record (its incarnation is not retired: heard from again, it is asked for a
        hello and joins anew)."""
        del self._records[engine_index]

    def retire(self, engine_index: int, incarnation: int, why: Retirement) -> None:
        """Ignore this incarnation from now on, for the reason ``why``."""
        key = (engine_index, incarnation)
        if why is Retirement.CLASHED:
            self._clashed[key] = None
            if len(self._clashed) > _MAX_CLASHED:
                del self._clashed[next(iter(self._clashed))]
        else:
            self._retired[key] = why
            if len(self._retired) > _MAX_RETIRED:
                del self._retired[next(iter(self._retired))]

    def is_retired(self, engine_index: int, incarnation: int) -> bool:
        key = (engine_index, incarnation)
        return key in self._retired or key in self._clashed

    def is_refused(self, engine_index: int, incarnation: int) -> bool:
        """Whether this incarnation was refused or clashed (what it sends is a protocol error)."""
        key = (engine_index, incarnation)
        return key in self._clashed or self._retired.get(key) is Retirement.REFUSED

    def pick(self, model_name: str, has_room: Callable[[EngineRecord], bool]) -> EngineRecord | None:
        """The least-loaded live engine serving ``model_name`` (the lowest index on a tie) that ``has_room``
        for another request."""
        candidates = [r for r in self.live() if r.model_name == model_name and has_room(r)]
        return min(candidates, key=lambda record: record.load_score, default=None)

    def serves(self, model_name: str) -> bool:
        """Whether a live engine serves ``model_name``."""
        return any(record.model_name == model_name for record in self.live())

    def served_models(self) -> list[ServedModel]:
        """Models served by live engines, in order of their lowest engine index."""
        by_name: dict[str, list[EngineRecord]] = {}
        for record in self.live():
            by_name.setdefault(record.model_name, []).append(record)
        models = []
        for name, records in by_name.items():
            first = records[0].hello
            models.append(
                ServedModel(
                    name=name,
                    tokenizer=records[0].tokenizer,
                    max_model_len=min(record.hello.max_model_len for record in records),
                    vocab_size=first.vocab_size,
                    eos_token_ids=tuple(first.eos_token_ids),
                )
            )
        return models
