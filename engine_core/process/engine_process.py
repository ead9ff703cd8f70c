"""The engine process's loop: one engine core, connected to a frontend over ZeroMQ (its CLI: engine_cli.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import zmq

from openinfer import protocol
from openinfer.engine_core.config import CHECKPOINT_METHODS, DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.process.frontend_links import STALLED, FrontendLink, FrontendLinks
from openinfer.engine_core.process.kv_event_publisher import KVEventPublisher
from openinfer.engine_core.process.tokenizer_files import read_tokenizer_config
from openinfer.engine_core.spec_decode.drafter_loaders import CANNOT_LOAD, NOT_ALLOWED, is_allowed
from openinfer.engine_core.spec_decode.spec_decoder import SpecDecoder
from openinfer.engine_core.worker.parallel.rank_group import RankGroupFailure

logger = logging.getLogger("openinfer.engine")

# Reconnection after the frontend goes away: the first try after 100 ms, then doubling up to one per 2 s.
_RECONNECT_IVL_MS = 100
_RECONNECT_IVL_MAX_MS = 2000


class CurveClientKeys(NamedTuple):
    """An engine's CurveZMQ key pair and the frontend's public key (``--zmq-curve-keys``)."""

    public: bytes
    secret: bytes
    server_public: bytes


class EngineProcess:
    """The socket loop around an :class:`EngineCore`: inputs from each frontend's DEALER, outputs to the PUSH
    of the frontend that sent the request (:class:`FrontendLinks`)."""

    def __init__(
        self, config: EngineConfig, core: EngineCore, curve_keys: CurveClientKeys | None = None
    ) -> None:
        self.config = config
        self.core = core
        self.curve_keys = curve_keys
        self.incarnation = core.incarnation
        self.seq = 0
        self.num_protocol_errors = 0
        self.input_codec = protocol.EngineInputCodec()
        self.output_codec = protocol.EngineOutputCodec()
        self.context = zmq.Context()
        identity = protocol.engine_identity(config.engine_index, self.incarnation)
        self.frontends = FrontendLinks(config.frontend_addresses, self._socket, identity)
        self.kv_events = (
            KVEventPublisher(config.kv_events_config, config.engine_index, self.context)
            if config.kv_events_config is not None and config.publishes_kv_events
            else None
        )
        self._stopping = False
        self.refusal: str | None = None  # why the frontend refused this engine (then run() returns)
        self.failure: str | None = None  # why the engine must end: a rank of its group failed (run() returns)
        # A drafter being loaded in the background, and the command that asked for it.
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-load")
        self._pending_load: tuple[FrontendLink, protocol.LoadDrafter, Future[SpecDecoder]] | None = None

    def _socket(self, kind: int) -> zmq.Socket:
        """A socket that finds its frontend again by itself: after it restarts, or its host vanishes."""
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_IVL_MAX_MS)
        # ZMTP pings: a frontend host that vanished without closing the connection is noticed in seconds.
        socket.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        if self.curve_keys is not None:
            socket.curve_publickey, socket.curve_secretkey, socket.curve_serverkey = self.curve_keys
        return socket

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> None:
        """Loop until stopped: read inputs, step while there is work, heartbeat when idle."""
        for link in self.frontends.links:
            self._send_hello(link)
        while not self._stopping:
            timeout_ms = 0 if self.core.has_work else int(self.config.heartbeat_interval * 1000)
            for link in self.frontends.readable(timeout_ms):
                self._read_inputs(link)
            busy = self.core.has_work
            try:
                outputs = self.core.step()
            except RankGroupFailure as e:  # its ranks are out of step: no later step can run
                self.failure = str(e)
                break
            except Exception:  # noqa: BLE001 - one bad step must not take the engine (and its peers) down
                logger.exception("an engine step failed; ending the requests it was running")
                outputs = self.core.fail_running("the engine failed while running this request; see its log")
            self._send_outputs(outputs)
            if self.kv_events is not None and self.core.kv_cache.event_log is not None:
                self.kv_events.publish(self.core.kv_cache.event_log.take())
            # After the send: a drafter of a new K starts its counters from zero, so the step's drafts must
            # leave in a snapshot of the counters that hold them (its spec-log lines name that seq).
            self._finish_drafter_load()
            if busy and self.config.step_sleep > 0:
                time.sleep(self.config.step_sleep)  # --step-sleep: a slowed engine, for latency tests
        self._loader.shutdown(wait=False, cancel_futures=True)
        if self.kv_events is not None:
            self.kv_events.close()
        self.context.destroy(linger=1000)

    def _read_inputs(self, link: FrontendLink) -> None:
        for frame in self.frontends.frames(link):
            try:
                message = self.input_codec.decode(frame)
            except protocol.ProtocolError as e:
                self.num_protocol_errors += 1
                logger.warning("dropped a bad frame from the frontend at %s (%s)", link.address, e)
                continue
            if isinstance(message, protocol.EngineCoreRequest):
                if self.frontends.accept(message.request_id, link):
                    self.core.add_request(message)
            elif isinstance(message, protocol.AbortRequests):
                self.core.abort(message.request_ids)
            elif isinstance(message, protocol.HelloRequest):
                self._send_hello(link)
            elif isinstance(message, protocol.HelloRefused):  # final: the engine stops (exit status 3)
                logger.error(
                    "the frontend refused this engine, which stops (frontend %s, protocol %d, engine %d): %s",
                    link.address,
                    message.protocol_version,
                    protocol.PROTOCOL_VERSION,
                    message.message,
                )
                self.refusal = message.message
                self._stopping = True
            else:
                self._change_drafter(message, link)

    @property
    def _start_anchor(self) -> protocol.DFlashAnchor | None:
        """The engine's --dflash-anchor, kept for drafters loaded at run time that name none."""
        return self.config.speculative.dflash_anchor if self.config.speculative is not None else None

    def _change_drafter(
        self, command: protocol.LoadDrafter | protocol.UnloadDrafter, link: FrontendLink
    ) -> None:
        """Unload now, or start loading in the background (heartbeats go on); answer with a DrafterReply."""
        if self._pending_load is not None:
            self._reply(
                link, command, False, "a drafter is still loading on this engine; try again when it is done"
            )
        elif isinstance(command, protocol.UnloadDrafter):
            self._announce_counters()
            self.core.unload_drafter()
            self._announce_counters()
            self._reply(link, command, True, "speculative decoding is off")
        elif command.draft_model and not is_allowed(command.draft_model, self.config.allowed_drafter_dirs):
            logger.warning("drafter load refused: %r is outside --allowed-drafter-dir", command.draft_model)
            self._reply(link, command, False, NOT_ALLOWED.format(path=command.draft_model))
        else:
            try:
                spec = DrafterSpec(
                    command.method,
                    command.num_spec_tokens,
                    Path(command.draft_model)
                    if command.draft_model
                    else self.config.default_draft_models.get(command.method),
                    command.prompt_lookup_min,
                    command.prompt_lookup_max,
                    command.dflash_anchor or self._start_anchor,
                    command.confidence_threshold,
                    command.enable_adaptive_verification,
                )
            except ValueError as e:  # options that cannot go together: the caller's answer, never a crash
                self._reply(link, command, False, str(e))
                return
            self._pending_load = (link, command, self._loader.submit(self.core.build_drafter, spec))

    def _finish_drafter_load(self) -> None:
        """Install a drafter whose background load finished, and answer; a failed load keeps the old one."""
        if self._pending_load is None or not self._pending_load[2].done():
            return
        link, command, future = self._pending_load
        self._pending_load = None
        try:
            loaded = future.result()
            self._announce_counters()
            described = self.core.install_drafter(loaded)
            self._announce_counters()
            self._reply(link, command, True, f"loaded {described}")
        except Exception as e:  # noqa: BLE001 - any load failure is the caller's answer, never a crash
            logger.warning("drafter load refused: %s: %s", type(e).__name__, e)
            self._reply(link, command, False, _load_failure(command, e))

    def _reply(
        self,
        link: FrontendLink,
        command: protocol.LoadDrafter | protocol.UnloadDrafter,
        ok: bool,
        message: str,
    ) -> None:
        spec_decoder = self.core.spec
        reply = protocol.DrafterReply(
            engine_index=self.config.engine_index,
            incarnation=self.incarnation,
            seq=self._next_seq(),
            command_id=command.command_id,
            ok=ok,
            message=message,
            num_spec_tokens=spec_decoder.num_spec_tokens if spec_decoder is not None else None,
            load=self.core.load_snapshot(),
        )
        self._send(link, reply)

    def _send_hello(self, link: FrontendLink) -> None:
        model_path = self.config.model_path
        tokenizer_config = model_path / "tokenizer_config.json"
        hello = protocol.EngineHello(
            protocol_version=protocol.PROTOCOL_VERSION,
            engine_index=self.config.engine_index,
            incarnation=self.incarnation,
            seq=self._next_seq(),
            model_name=self.config.served_model_name,
            max_model_len=self.core.facts.max_model_len,
            kv_block_size=self.core.facts.block_size,
            kv_num_blocks=self.core.facts.num_kv_blocks,
            num_spec_tokens=self.core.spec.num_spec_tokens if self.core.spec is not None else None,
            vocab_size=self.core.facts.vocab_size,
            eos_token_ids=sorted(self.core.facts.eos_token_ids),
            tokenizer_json=(model_path / "tokenizer.json").read_bytes(),
            tokenizer_config_json=read_tokenizer_config(tokenizer_config.parent),
            load=self.core.load_snapshot(),
            exports_metrics=link.exports_metrics,
            kv_events=self.kv_events.source if self.kv_events is not None else None,
        )
        self._send(link, hello)

    def _send_outputs(self, outputs: list[protocol.EngineCoreOutput]) -> None:
        """Each frontend's outputs to it, and a heartbeat to each that is due one; one load snapshot for all."""
        due = self.frontends.by_link(outputs, self.config.heartbeat_interval)
        if not due:
            return
        load = self.core.load_snapshot()
        for link, mine in due:
            self._send(link, self._outputs_message(mine, load), mine)

    def _outputs_message(
        self, outputs: list[protocol.EngineCoreOutput], load: protocol.LoadSnapshot
    ) -> protocol.EngineCoreOutputs:
        return protocol.EngineCoreOutputs(
            engine_index=self.config.engine_index,
            incarnation=self.incarnation,
            seq=self._next_seq(),
            timestamp=time.time(),
            outputs=outputs,
            load=load,
        )

    def _announce_counters(self) -> None:
        """Send the metrics frontend the counters as they are now, around a drafter change (before and after).

        A change may start the counters from zero (a new K, an unload, a load after none); the frontend sees
        the change only by the snapshots it gets. Before: the old counters' last drafts reach it (the steps
        since its last message may have answered other frontends only, and their drafts would be lost with the
        old counters). After: it sees the new counters' start, so an unload and a reload of the same K in one
        heartbeat interval read as None then zero, never as a counter that went down."""
        load = self.core.load_snapshot()
        for link in self.frontends.links:
            if link.exports_metrics:
                self._send(link, self._outputs_message([], load))

    def _send(
        self,
        link: FrontendLink,
        message: protocol.EngineOutput,
        outputs: Sequence[protocol.EngineCoreOutput] = (),
    ) -> None:
        """Send without blocking; a stalled frontend's requests end with an error (delivered when it reads)."""
        if not self.frontends.send(link, self.output_codec.encode(message), outputs):
            self.core.abort(self.frontends.requests_of(link), error=STALLED)

    def _next_seq(self) -> int:
        """The seq of the message about to be sent; its snapshot holds every spec-log line written so far."""
        seq = self.seq
        self.seq += 1
        if self.core.spec_log is not None:
            self.core.spec_log.sending(seq)
        return seq


def _load_failure(command: protocol.LoadDrafter, error: Exception) -> str:
    """What a client is told of a failed load: a checkpoint read from a path says nothing of the files
    (that they exist, what they hold); a load that read no files (n-gram) says what was wrong."""
    if command.method in CHECKPOINT_METHODS and command.draft_model:
        return CANNOT_LOAD.format(path=command.draft_model)
    if command.method in CHECKPOINT_METHODS:
        return "cannot load the engine's default drafter; the engine's log says why"
    return f"{type(error).__name__}: {error}"
