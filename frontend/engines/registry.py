"""What the frontend knows about its engines: one current incarnation per engine index."""

from __future__ import annotations

import asyncio
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


_MAX_RETIRED = 4096  # an incarnation forgotten after this many newer ones: its outputs get a HelloRequest


class EngineRegistry:
    """Engine records by index, and the incarnations that are over (restarted or refused)."""

    def __init__(self) -> None:
        self._records: dict[int, EngineRecord] = {}
        # (index, incarnation) whose messages are ignored -> whether it was refused (not replaced), oldest
        # first; bounded, as strangers can make many
        self._retired: dict[tuple[int, int], bool] = {}

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
            self.retire(previous.index, previous.incarnation)
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

    def retire(self, engine_index: int, incarnation: int, refused: bool = False) -> None:
        """Ignore this incarnation from now on: it was ``refused``, or it was replaced."""
        self._retired[(engine_index, incarnation)] = refused
        if len(self._retired) > _MAX_RETIRED:
            del self._retired[next(iter(self._retired))]

    def is_retired(self, engine_index: int, incarnation: int) -> bool:
        return (engine_index, incarnation) in self._retired

    def is_refused(self, engine_index: int, incarnation: int) -> bool:
        """Whether this incarnation's hello was refused (its messages are protocol errors)."""
        return self._retired.get((engine_index, incarnation), False)

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
