"""The api servers' peers folder and views as untrusted input (issue 39, item 5): a folder others can write is
refused; no link planted there is followed; a file, socket or process of another user's is not used (and
counted); a peer's view that does not decode, is too big or holds impossible values is left out of /metrics
(and counted), which still answers."""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from openinfer.frontend.metrics.api_servers import ApiServers
from openinfer.frontend.metrics.peer_view import MAX_VIEW_BYTES
from tests.frontend.metrics.peers import (
    NOBODY,
    api_server_0,
    effective_uid,
    engine_1_view,
    exporting,
    fake_peer,
    leave_view_file,
    needs_root,
    view,
)
from tests.frontend.metrics.scrape import sample

GAUGE = "# TYPE openinfer:engine_up gauge\n"
DRAFTS = "# TYPE vllm:spec_decode_num_drafts_total counter\n"


def errors(text: str, kind: str) -> float:
    return sample(text, "openinfer:protocol_errors_total", kind=kind) or 0.0


async def scrape_twice(servers: ApiServers) -> tuple[str, str]:
    """Two scrapes: what the first shows, and the second (which shows the errors the first counted)."""
    first = (await servers.exposition()).decode()
    return first, (await servers.exposition()).decode()


def engine_up(text: str, engine: str) -> float | None:
    return sample(text, "openinfer:engine_up", engine=engine)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "peers"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A 0755 folder other users can reach (in /tmp: tmp_path's parents are root's alone)."""
    with tempfile.TemporaryDirectory() as path:
        os.chmod(path, 0o755)
        yield Path(path)


def test_a_folder_others_can_write_or_own_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """A 1777 folder (/tmp's mode), a 0770 one, a link to a private folder and a folder of another user's
    are refused at start with what to do; a missing one is made 0700."""
    shared, group, private = tmp_path / "shared", tmp_path / "group", tmp_path / "private"
    for path, mode in ((shared, 0o1777), (group, 0o770), (private, 0o700)):
        path.mkdir()
        path.chmod(mode)
    (tmp_path / "link").symlink_to(private)
    with pytest.raises(
        OSError, match=r"--peers-dir: .*shared can be written by other users \(mode 1777\).*chmod go-w"
    ):
        api_server_0(shared)
    with pytest.raises(OSError, match=r"group can be written by other users \(mode 770\)"):
        api_server_0(group)
    with pytest.raises(OSError, match="link is a symbolic link"):
        api_server_0(tmp_path / "link")
    api_server_0(tmp_path / "new")
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


@needs_root
def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    """A 0700 folder that another user owns (who could plant anything in it) is refused."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(OSError, match=f"belongs to another user \\(uid {NOBODY}\\)"):
        api_server_0(theirs)


def test_links_planted_in_place_of_the_view_files_are_not_written_through(
    folder: Path, tmp_path: Path
) -> None:
    """Links at this api server's view file and at its temporary file, to files of this user's: saving the
    view writes neither file; the view file is then a regular file, 0600."""
    victims = [tmp_path / "victim-of-tmp", tmp_path / "victim-of-view"]
    for victim in victims:
        victim.write_bytes(b"precious")
    servers = api_server_0(folder)
    (folder / ".api-server-0.view.tmp").symlink_to(victims[0])
    (folder / "api-server-0.view").symlink_to(victims[1])
    servers.own_view()
    assert [victim.read_bytes() for victim in victims] == [b"precious", b"precious"]
    saved = folder / "api-server-0.view"
    assert not saved.is_symlink() and saved.stat().st_mode & 0o777 == 0o600


async def test_a_link_in_place_of_a_peers_view_file_is_not_read(folder: Path, tmp_path: Path) -> None:
    """Api server 1's view file is a link to a view file elsewhere: it is not read (its engine 1 is not
    shown) and counted as peer_stranger."""
    elsewhere = tmp_path / "elsewhere.view"
    elsewhere.write_bytes(engine_1_view())
    (folder / "api-server-1.view").symlink_to(elsewhere)
    first, second = await scrape_twice(api_server_0(folder))
    assert engine_up(first, "0") == 1 and engine_up(first, "1") is None
    assert errors(second, "peer_stranger") == 1


@needs_root
async def test_a_view_file_of_another_user_is_not_read(folder: Path) -> None:
    """Api server 1's view file belongs to another user: it is not read, and counted."""
    os.chown(leave_view_file(folder, engine_1_view()), NOBODY, NOBODY)
    first, second = await scrape_twice(api_server_0(folder))
    assert engine_up(first, "1") is None and errors(second, "peer_stranger") == 1


@needs_root
async def test_a_socket_listened_on_by_another_user_is_not_asked(folder: Path) -> None:
    """A socket at api server 1's path, of this user's file but listened on by another user's process
    (SO_PEERCRED), answering a plausible view of engine 7: none of it is shown, and it is counted."""
    fake = view(f"{GAUGE}openinfer:engine_up{{engine=\"7\"}} 1.0\n{DRAFTS}"
                f"vllm:spec_decode_num_drafts_total{{engine=\"7\",model_name=\"m\"}} 5.0\n")  # fmt: skip
    async with fake_peer(folder / "api-server-1.sock", fake, listener_uid=NOBODY):
        first, second = await scrape_twice(api_server_0(folder))
    assert engine_up(first, "7") is None and errors(second, "peer_stranger") == 1


@needs_root
async def test_a_process_of_another_user_gets_no_view(reachable: Path) -> None:
    """A process of another user that reaches api server 0's socket (a 0755 folder, the socket made 0666
    after start) gets a 403 and no view (a view names engine incarnations); the refusal is counted."""
    servers = api_server_0(reachable)
    await servers.start()
    try:
        path = reachable / "api-server-0.sock"
        path.chmod(0o666)
        stranger = socket.socket(socket.AF_UNIX)
        with effective_uid(NOBODY):
            stranger.connect(str(path))
        reader, writer = await asyncio.open_unix_connection(sock=stranger)
        writer.write(b"GET /view HTTP/1.0\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        await servers.close()
    assert answer.startswith(b"HTTP/1.0 403 "), answer[:100]
    assert b"openinfer:engine_up" not in answer
    assert errors(servers.metrics.render().decode(), "peer_stranger") == 1


BAD_VIEWS = {
    "not msgpack": b"\xc1 garbage",
    "not a view": view("x")[:-1] + b"\xff",
    "not an exposition": view("this is not an exposition {\n"),
    "huge": view(f"{GAUGE}openinfer:engine_up{{engine=\"1\"}} 1.0\n" + "# padding\n" * (MAX_VIEW_BYTES // 10)),
    "9.99e17 drafts": view(f"{DRAFTS}vllm:spec_decode_num_drafts_total{{engine=\"7\",model_name=\"m\"}} 9.99e17\n"),
    "NaN": view(f"{GAUGE}openinfer:engine_up{{engine=\"1\"}} NaN\n"),
    "negative": view(f"{GAUGE}openinfer:engine_up{{engine=\"1\"}} -1.0\n"),
    "untyped": view("openinfer:engine_up{engine=\"1\"} 1.0\n"),
    "another type": view("# TYPE openinfer:engine_up counter\nopeninfer:engine_up_total{engine=\"1\"} 1.0\n"),
    "our engine": view(f"{GAUGE}openinfer:engine_up{{engine=\"0\"}} 1.0\n"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_VIEWS))
async def test_a_bad_peer_view_is_left_out_counted_and_metrics_answer(folder: Path, case: str) -> None:
    """Api server 1's last view (it does not answer) is garbage, too big, or holds values no api server
    exports (9.99e17, NaN, negative, an untyped family, a family of another type than here, the engine this
    api server exports): the scrape shows this api server's own series, none of the view's, and counts it."""
    leave_view_file(folder, BAD_VIEWS[case])
    servers = api_server_0(folder)
    first, second = await scrape_twice(servers)
    assert engine_up(first, "0") == 1 and engine_up(first, "1") is None and engine_up(first, "7") is None
    assert sample(first, "vllm:spec_decode_num_drafts_total", engine="0", model_name="m") == 3
    assert errors(second, "peer_view") == 1


async def test_a_huge_answer_on_the_socket_is_cut_and_left_out(folder: Path) -> None:
    """A peer of this user's answering a view bigger than any: it is read no further than the bound, left
    out and counted."""
    huge = BAD_VIEWS["huge"]
    async with fake_peer(folder / "api-server-1.sock", huge):
        first, second = await scrape_twice(api_server_0(folder))
    assert engine_up(first, "1") is None and errors(second, "peer_view") == 1


async def test_api_servers_show_each_others_views_over_their_sockets_then_files(folder: Path) -> None:
    """Two api servers started in one folder: each scrape shows both engines (the peer's from its socket),
    no error is counted; once api server 1 stops answering, its view file shows engine 1 still."""
    zero, one = api_server_0(folder), ApiServers(exporting(1), folder, 1, 2)
    await zero.start()
    await one.start()
    try:
        text = (await zero.exposition()).decode()
        assert (engine_up(text, "0"), engine_up(text, "1")) == (1, 1)
        assert (await one.counted_seqs()).keys() == {"0", "1"}
    finally:
        await one.close()
    text = (await zero.exposition()).decode()
    await zero.close()
    assert (engine_up(text, "0"), engine_up(text, "1")) == (1, 1)
    assert "openinfer:protocol_errors_total{" not in text
