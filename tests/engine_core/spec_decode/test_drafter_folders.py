"""Drafters loaded at run time come only from --allowed-drafter-dir, and the engine's answers never tell a
client what the file system holds: a real engine loop, driven over its ZeroMQ sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from openinfer import protocol
from openinfer.engine_core.builtin_model import builtin_drafter_folder, builtin_target_folder
from openinfer.engine_core.config import DrafterSpec, EngineConfig
from openinfer.engine_core.core.engine_core import EngineCore
from openinfer.engine_core.launch.local_cluster import free_port_pair
from openinfer.engine_core.process.engine_args import config_from_args, parse_args
from openinfer.engine_core.process.engine_cli import load_runner
from openinfer.engine_core.process.engine_process import EngineProcess
from openinfer.engine_core.spec_decode.drafter_loaders import default_drafter_folders, is_allowed
from openinfer.engine_core.testing.dflash_checkpoint import make_tiny_dflash_checkpoint
from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3 as SMALL
from openinfer.engine_core.testing.tiny_model import make_tiny_checkpoint


def test_symlinks_and_dot_dot_cannot_leave_an_allowed_folder(tmp_path: Path) -> None:
    """Paths are judged after resolving: a link out of the folder, or '..' out of it, is outside."""
    allowed, outside = tmp_path / "drafters", tmp_path / "private"
    (allowed / "d").mkdir(parents=True)
    outside.mkdir()
    (allowed / "link").symlink_to(outside)
    folders = (allowed,)
    assert is_allowed(str(allowed / "d"), folders) and is_allowed(str(allowed / "not-there"), folders)
    assert not is_allowed(str(allowed / "link"), folders)
    assert not is_allowed(str(allowed / "link" / "d"), folders)
    assert not is_allowed(f"{allowed}/d/../../private", folders)
    assert not is_allowed(str(tmp_path / "drafters-2"), folders)  # a sibling sharing the prefix
    assert not is_allowed("bad\0path", folders)


def test_by_default_the_model_and_draft_model_folders_are_allowed(tmp_path: Path) -> None:
    """Default: the folders holding --model and --draft-model; for the built-in pair that is the package's
    builtin/ folder, so its drafter loads at run time. --allowed-drafter-dir replaces the default."""
    builtin = config_from_args(parse_args([]))
    assert builtin.allowed_drafter_dirs == (builtin_target_folder().parent,)
    assert is_allowed(str(builtin_drafter_folder()), builtin.allowed_drafter_dirs)
    mine = config_from_args(
        parse_args(["--model", "/models/q", "--spec-method", "dflash", "--num-spec-tokens", "3",
                    "--draft-model", "/drafters/d"])
    )  # fmt: skip
    assert mine.allowed_drafter_dirs == (Path("/models"), Path("/drafters"))
    given = config_from_args(parse_args(["--allowed-drafter-dir", "/a", "--allowed-drafter-dir", "/b"]))
    assert given.allowed_drafter_dirs == (Path("/a"), Path("/b"))
    assert default_drafter_folders(Path("/q"), None) == ()  # never the root


@pytest.mark.parametrize("method", ["dflash", "dspark"])
@pytest.mark.parametrize("model", [[], ["--model", "BUILTIN"]], ids=["no-model", "its-folder"])
def test_the_builtin_target_brings_its_drafters(method: str, model: list[str]) -> None:
    """openinfer-engine on the built-in target, named by its folder (as openinfer-serve names it) or not:
    --spec-method dflash or dspark needs no --draft-model (the built-in drafter of that method), and a
    run-time load without a folder gets the built-in drafter of its method."""
    model = [str(builtin_target_folder()) if arg == "BUILTIN" else arg for arg in model]
    config = config_from_args(parse_args([*model, "--spec-method", method, "--num-spec-tokens", "7"]))
    assert config.speculative is not None
    assert config.speculative.draft_model == builtin_drafter_folder(method)
    assert config.default_draft_models == {m: builtin_drafter_folder(m) for m in ("dflash", "dspark")}
    assert builtin_drafter_folder("dspark") != builtin_drafter_folder("dflash")


def test_another_model_needs_a_drafter_folder(tmp_path: Path) -> None:
    """Another --model brings no drafter: --spec-method dflash without --draft-model is refused at start,
    saying what to give, and a run-time load that names no folder has no default."""
    with pytest.raises(ValueError, match=r"dflash needs a checkpoint folder \(--draft-model PATH"):
        config_from_args(
            parse_args(["--model", str(tmp_path), "--spec-method", "dflash", "--num-spec-tokens", "3"])
        )
    assert config_from_args(parse_args(["--model", str(tmp_path)])).default_draft_models == {}


class EngineUnderTest:
    """An engine loop in a thread, with this test as its frontend (a ROUTER and a PULL)."""

    def __init__(self, target: Path, allowed: Path) -> None:
        port = free_port_pair()
        config = EngineConfig(
            model_path=target, served_model_name="t", num_kv_blocks=64,
            frontend_addresses=(f"tcp://127.0.0.1:{port}",), allowed_drafter_dirs=(allowed,),
        )  # fmt: skip
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(config.frontend_address)
        self.pull = self.context.socket(zmq.PULL)
        self.pull.bind(config.output_address)
        self.process = EngineProcess(config, EngineCore(config, load_runner(config)))
        self.thread = threading.Thread(target=self.process.run, daemon=True)
        self.thread.start()
        self.codec, self.commands = protocol.EngineOutputCodec(), protocol.EngineInputCodec()
        assert isinstance(self.receive(), protocol.EngineHello)
        self.identity = protocol.engine_identity(0, self.process.incarnation)

    def receive(self) -> protocol.EngineOutput:
        assert self.pull.poll(30_000), "the engine sent nothing for 30 s"
        return self.codec.decode(self.pull.recv())

    def load(self, draft_model: str) -> protocol.DrafterReply:
        command = protocol.LoadDrafter(f"c{draft_model}", "dflash", 3, draft_model=draft_model)
        for _ in range(100):  # until the engine's DEALER has connected
            try:
                self.router.send_multipart([self.identity, self.commands.encode(command)])
                break
            except zmq.ZMQError:
                time.sleep(0.05)
        while not isinstance(reply := self.receive(), protocol.DrafterReply):
            pass
        assert reply.command_id == command.command_id
        return reply

    def close(self) -> None:
        self.process.stop()
        self.thread.join(10)
        self.context.destroy(linger=0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineUnderTest, Path]]:
    root = tmp_path_factory.mktemp("folders")
    target = make_tiny_checkpoint(root / "models" / "t", seed=5, overrides=SMALL)
    allowed = root / "drafters"
    make_tiny_dflash_checkpoint(allowed / "good", target, seed=1, target_layer_ids=(0,))
    make_tiny_dflash_checkpoint(root / "private" / "good", target, seed=1, target_layer_ids=(0,))
    (allowed / "empty").mkdir()
    (allowed / "garbage").mkdir()
    (allowed / "garbage" / "config.json").write_text("{not json")
    (allowed / "escape").symlink_to(root / "private")
    under_test = EngineUnderTest(target, allowed)
    try:
        assert under_test.load(str(allowed / "good")).ok  # K=3 from here on: failed loads keep it
        yield under_test, root
    finally:
        under_test.close()


def test_a_drafter_under_an_allowed_folder_loads(engine: tuple[EngineUnderTest, Path]) -> None:
    process, root = engine
    reply = process.load(str(root / "drafters" / "good"))
    assert reply.ok and reply.num_spec_tokens == 3 and reply.message.startswith("loaded")


@pytest.mark.parametrize(
    "where", ["private/good", "private/missing", "drafters/escape/good", "drafters/../private/good"]
)
def test_paths_outside_are_refused_alike_whether_they_exist_or_not(
    engine: tuple[EngineUnderTest, Path], where: str
) -> None:
    """A real checkpoint outside, a missing one, a link or '..' out of the folder: the same refusal, which
    names only the path sent."""
    process, root = engine
    path = f"{root}/{where}"
    reply = process.load(path)
    assert not reply.ok
    assert reply.message == (
        f"draft_model {path!r} is not under a folder this engine loads drafters from (--allowed-drafter-dir)"
    )


@pytest.mark.parametrize("where", ["missing", "empty", "garbage"])
def test_unloadable_checkpoints_inside_say_nothing_of_the_files(
    engine: tuple[EngineUnderTest, Path], where: str
) -> None:
    """Missing, without config.json, or with a config that is not JSON: one message, naming only the path
    sent (the engine's log has the reason); the drafter loaded before stays."""
    process, root = engine
    path = f"{root}/drafters/{where}"
    reply = process.load(path)
    assert not reply.ok and reply.num_spec_tokens == 3  # the drafter loaded before
    assert reply.message == f"cannot load a drafter from the path given ({path!r}); the engine's log says why"


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_a_checkpoint_drafter_without_its_folder_is_refused(method: str) -> None:
    """A DFlash or DSpark drafter needs its checkpoint folder: refused where it is named, saying which flag."""
    with pytest.raises(ValueError, match="--draft-model PATH"):
        DrafterSpec(method, 7)
