"""``openinfer-engine``: one engine-core process, connected to a frontend over ZeroMQ."""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import zmq
import zmq.auth

from openinfer.engine_core.builtin_model import (
    BUILTIN_MODEL_NAME,
    builtin_drafter_folder,
    builtin_target_folder,
)
from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.engine_core import EngineCore
from openinfer.engine_core.fake_model_runner import builtin_tokenizer_folder
from openinfer.engine_core.spec_decode.spec_decoder import DrafterSpec, SpecDecoder
from openinfer.engine_core.tokenizer_files import read_tokenizer_config
from openinfer.protocol import (
    PROTOCOL_VERSION,
    AbortRequests,
    DrafterReply,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineHello,
    EngineInputCodec,
    EngineOutputCodec,
    HelloRefused,
    HelloRequest,
    LoadDrafter,
    ProtocolError,
    UnloadDrafter,
    engine_identity,
)

logger = logging.getLogger("openinfer.engine")

FAKE_MODEL_NAME = "openinfer-fake"
# Reconnection after the frontend goes away: the first try after 100 ms, then doubling up to one per 2 s.
_RECONNECT_IVL_MS = 100
_RECONNECT_IVL_MAX_MS = 2000


def curve_client_keys(folder: Path, engine_index: int) -> tuple[bytes, bytes, bytes]:
    """(engine public key, engine secret key, frontend public key) from an ``openinfer-keys`` folder.

    The layout (see :mod:`openinfer.frontend.curve_keys`): ``DIR/frontend.key`` and
    ``DIR/engines/engine-<index>.key_secret``.
    """
    frontend_key = folder / "frontend.key"
    engine_key = folder / "engines" / f"engine-{engine_index}.key_secret"
    for path in (frontend_key, engine_key):
        if not path.is_file():
            raise FileNotFoundError(
                f"--zmq-curve-keys: {path} not found; make keys with `openinfer-keys {folder} --engines N` "
                "and copy the frontend's public key and this engine's key pair to its host"
            )
    server_public, _ = zmq.auth.load_certificate(frontend_key)
    public, secret = zmq.auth.load_certificate(engine_key)
    if secret is None:
        raise ValueError(f"--zmq-curve-keys: {engine_key} holds no secret key")
    return public, secret, server_public


class EngineProcess:
    """The socket loop around an :class:`EngineCore`: inputs from the DEALER, outputs to the PUSH."""

    def __init__(self, config: EngineConfig, core: EngineCore) -> None:
        self.config = config
        self.core = core
        self.incarnation = core.incarnation
        self.seq = 0
        self.num_protocol_errors = 0
        self.input_codec = EngineInputCodec()
        self.output_codec = EngineOutputCodec()
        self.context = zmq.Context()
        self.requests = self._socket(zmq.DEALER)
        self.requests.setsockopt(zmq.ROUTING_ID, engine_identity(config.engine_index, self.incarnation))
        self.requests.setsockopt(zmq.LINGER, 0)
        self.requests.connect(config.frontend_address)
        self.outputs = self._socket(zmq.PUSH)
        self.outputs.setsockopt(zmq.LINGER, 1000)
        self.outputs.connect(config.output_address)
        self._stopping = False
        # A drafter being loaded in the background, and the command that asked for it.
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-load")
        self._pending_load: tuple[LoadDrafter, Future[SpecDecoder]] | None = None

    def _socket(self, kind: int) -> zmq.Socket:
        """A socket that finds its frontend again by itself: after it restarts, or its host vanishes."""
        socket = self.context.socket(kind)
        socket.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_IVL_MAX_MS)
        # ZMTP pings: a frontend host that vanished without closing the connection is noticed in seconds.
        socket.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
        if self.config.curve_keys is not None:
            public, secret, server = curve_client_keys(self.config.curve_keys, self.config.engine_index)
            socket.curve_publickey, socket.curve_secretkey, socket.curve_serverkey = public, secret, server
        return socket

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> None:
        """Loop until stopped: read inputs, step while there is work, heartbeat when idle."""
        self._send_hello()
        last_sent = time.monotonic()
        poller = zmq.Poller()
        poller.register(self.requests, zmq.POLLIN)
        while not self._stopping:
            timeout_ms = 0 if self.core.has_work else int(self.config.heartbeat_interval * 1000)
            if poller.poll(timeout_ms):
                self._read_inputs()
            busy = self.core.has_work
            try:
                outputs = self.core.step()
            except Exception:  # noqa: BLE001 - one bad step must not take the engine (and its peers) down
                logger.exception("an engine step failed; ending the requests it was running")
                outputs = self.core.fail_running("the engine failed while running this request; see its log")
            self._finish_drafter_load()
            now = time.monotonic()
            if outputs or now - last_sent >= self.config.heartbeat_interval:
                self._send_outputs(outputs)
                last_sent = now
            if busy and self.config.step_sleep > 0:
                time.sleep(self.config.step_sleep)  # --step-sleep: a slowed engine, for latency tests
        self._loader.shutdown(wait=False, cancel_futures=True)
        self.context.destroy(linger=1000)

    def _read_inputs(self) -> None:
        while True:
            try:
                frame = self.requests.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            try:
                message = self.input_codec.decode(frame)
            except ProtocolError as e:
                self.num_protocol_errors += 1
                logger.warning("dropped a bad frame from the frontend (%s)", e)
                continue
            if isinstance(message, EngineCoreRequest):
                self.core.add_request(message)
            elif isinstance(message, AbortRequests):
                self.core.abort(message.request_ids)
            elif isinstance(message, HelloRequest):
                self._send_hello()
            elif isinstance(message, HelloRefused):
                logger.error(
                    "the frontend refused this engine (it speaks protocol version %d, this engine %d): %s",
                    message.protocol_version,
                    PROTOCOL_VERSION,
                    message.message,
                )
            else:
                self._change_drafter(message)

    @property
    def _start_anchor(self) -> str | None:
        """The engine's --dflash-anchor, kept for drafters loaded at run time that name none."""
        return self.config.speculative.dflash_anchor if self.config.speculative is not None else None

    def _change_drafter(self, command: LoadDrafter | UnloadDrafter) -> None:
        """Unload now, or start loading in the background (heartbeats go on); answer with a DrafterReply."""
        if self._pending_load is not None:
            self._reply(
                command, False, "a drafter is still loading on this engine; try again when it is done"
            )
        elif isinstance(command, UnloadDrafter):
            self.core.unload_drafter()
            self._reply(command, True, "speculative decoding is off")
        else:
            spec = DrafterSpec(
                command.method,
                command.num_spec_tokens,
                Path(command.draft_model) if command.draft_model else self.config.default_draft_model,
                command.prompt_lookup_min,
                command.prompt_lookup_max,
                command.dflash_anchor or self._start_anchor,
            )
            self._pending_load = (command, self._loader.submit(self.core.build_drafter, spec))

    def _finish_drafter_load(self) -> None:
        """Install a drafter whose background load finished, and answer; a failed load keeps the old one."""
        if self._pending_load is None or not self._pending_load[1].done():
            return
        command, future = self._pending_load
        self._pending_load = None
        try:
            self._reply(command, True, f"loaded {self.core.install_drafter(future.result())}")
        except Exception as e:  # noqa: BLE001 - any load failure is the caller's answer, never a crash
            logger.warning("drafter load refused: %s", e)
            self._reply(command, False, f"{type(e).__name__}: {e}")

    def _reply(self, command: LoadDrafter | UnloadDrafter, ok: bool, message: str) -> None:
        spec_decoder = self.core.spec
        reply = DrafterReply(
            engine_index=self.config.engine_index,
            incarnation=self.incarnation,
            seq=self._next_seq(),
            command_id=command.command_id,
            ok=ok,
            message=message,
            num_spec_tokens=spec_decoder.num_spec_tokens if spec_decoder is not None else None,
            load=self.core.load_snapshot(),
        )
        self.outputs.send(self.output_codec.encode(reply))

    def _send_hello(self) -> None:
        model_path = self.config.model_path
        tokenizer_config = model_path / "tokenizer_config.json"
        hello = EngineHello(
            protocol_version=PROTOCOL_VERSION,
            engine_index=self.config.engine_index,
            incarnation=self.incarnation,
            seq=self._next_seq(),
            model_name=self.config.served_model_name,
            max_model_len=self.core.max_model_len,
            kv_block_size=self.config.block_size,
            kv_num_blocks=self.core.kv_cache.num_blocks,
            num_spec_tokens=self.core.spec.num_spec_tokens if self.core.spec is not None else None,
            vocab_size=self.core.model_config.vocab_size,
            eos_token_ids=sorted(self.core.eos_token_ids),
            tokenizer_json=(model_path / "tokenizer.json").read_bytes(),
            tokenizer_config_json=read_tokenizer_config(tokenizer_config.parent),
            load=self.core.load_snapshot(),
        )
        self.outputs.send(self.output_codec.encode(hello))

    def _send_outputs(self, outputs: list[EngineCoreOutput]) -> None:
        message = EngineCoreOutputs(
            engine_index=self.config.engine_index,
            incarnation=self.incarnation,
            seq=self._next_seq(),
            timestamp=time.time(),
            outputs=outputs,
            load=self.core.load_snapshot(),
        )
        self.outputs.send(self.output_codec.encode(message), copy=False)

    def _next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="openinfer-engine", description=__doc__)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--gpu", type=int, metavar="N", help="run on CUDA device N")
    where.add_argument("--device", choices=["cpu", "cuda"], help="run on this device (cuda: device 0)")
    parser.add_argument("--model", help="Hugging Face Qwen3 folder (default: the built-in tiny model)")
    parser.add_argument("--served-model-name", help="the model name clients use (default: --model as given)")
    parser.add_argument(
        "--frontend",
        default="tcp://127.0.0.1:5555",
        help="the frontend's engine address tcp://HOST:PORT (outputs go to PORT+1)",
    )
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="auto: float32 on the CPU, bfloat16 on CUDA",
    )
    parser.add_argument("--kv-cache-gb", type=float, default=1.0, help="KV cache memory in GiB")
    parser.add_argument("--num-kv-blocks", type=int, help="exact KV block count (overrides --kv-cache-gb)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--num-threads",
        type=int,
        default=1,
        help="torch CPU threads (1: best decode latency when engines share the cores)",
    )
    spec = parser.add_argument_group("speculative decoding")
    spec.add_argument("--spec-method", choices=["ngram", "dflash"], help="drafter (default: none)")
    spec.add_argument("--num-spec-tokens", type=int, help="K, draft tokens per round (at most 32)")
    spec.add_argument(
        "--draft-model",
        help="DFlash checkpoint folder (z-lab layout; default without --model: the built-in drafter)",
    )
    spec.add_argument(
        "--dflash-anchor",
        choices=["mask_slots", "anchor_slot"],
        help="which DFlash block slots carry drafts when the checkpoint's config does not say",
    )
    spec.add_argument("--prompt-lookup-min", type=int, default=1, help="ngram: shortest n-gram to match")
    spec.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest n-gram to match")
    spec.add_argument("--spec-log", help="append one JSON line per draft to this file")
    parser.add_argument(
        "--fake-model",
        action="store_true",
        help="no model: cheap deterministic tokens (a 32-token cycle) with the built-in tokenizer, for "
        "measuring the frontend; works with --spec-method ngram",
    )
    parser.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds slept after each busy step (a slowed engine)"
    )
    parser.add_argument(
        "--zmq-curve-keys",
        metavar="DIR",
        help="encrypt and authenticate the frontend connection with CurveZMQ keys made by openinfer-keys DIR",
    )
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    if args.fake_model:
        if args.model is not None:
            raise ValueError("--fake-model serves no model: drop --model")
        model_path = builtin_tokenizer_folder()
        name = args.served_model_name or FAKE_MODEL_NAME
    elif args.model is None:
        model_path = builtin_target_folder()
        name = args.served_model_name or BUILTIN_MODEL_NAME
    else:
        model_path = Path(args.model)
        name = args.served_model_name or args.model
    # The built-in target comes with its DFlash drafter: --spec-method dflash needs no --draft-model there.
    default_draft = builtin_drafter_folder() if args.model is None and not args.fake_model else None
    speculative = None
    if args.spec_method is not None:
        if args.num_spec_tokens is None:
            raise ValueError("--spec-method needs --num-spec-tokens K")
        speculative = DrafterSpec(
            args.spec_method,
            args.num_spec_tokens,
            Path(args.draft_model) if args.draft_model else default_draft,
            args.prompt_lookup_min,
            args.prompt_lookup_max,
            args.dflash_anchor,
        )
    elif args.num_spec_tokens is not None or args.draft_model is not None:
        raise ValueError("--num-spec-tokens and --draft-model need --spec-method ngram|dflash")
    if args.gpu is not None:
        device = f"cuda:{args.gpu}"
    else:
        device = "cuda:0" if args.device == "cuda" else "cpu"
    return EngineConfig(
        model_path=model_path,
        served_model_name=name,
        device=device,
        dtype=args.dtype,
        engine_index=args.engine_index,
        frontend_address=args.frontend,
        kv_cache_gb=args.kv_cache_gb,
        num_kv_blocks=args.num_kv_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        seed=args.seed,
        speculative=speculative,
        default_draft_model=default_draft,
        spec_log=Path(args.spec_log) if args.spec_log else None,
        fake_model=args.fake_model,
        step_sleep=args.step_sleep,
        curve_keys=Path(args.zmq_curve_keys) if args.zmq_curve_keys else None,
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``openinfer-engine``."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s engine{args.engine_index} %(levelname)s %(message)s",
    )
    torch.set_num_threads(max(1, args.num_threads))
    try:
        config = config_from_args(args)
        core = EngineCore(config, incarnation=random.getrandbits(64))
        process = EngineProcess(config, core)
    except (ValueError, FileNotFoundError) as e:
        logger.error("%s", e)
        sys.exit(2)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: process.stop())
    logger.info(
        "engine %d (incarnation %016x) serving %s on %s, %d KV blocks of %d; frontend %s",
        config.engine_index,
        process.incarnation,
        config.served_model_name,
        config.device,
        core.kv_cache.num_blocks,
        config.block_size,
        config.frontend_address,
    )
    process.run()
    logger.info("engine %d stopped", config.engine_index)


if __name__ == "__main__":
    main()
