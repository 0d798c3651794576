"""One follow of a signed channel on a node (real files, real ssh-keygen signatures, real release
archives; only the server is stood in for, by reading the channel's directory): it takes the
newest eligible version, records why it took no other, and changes nothing when the server, the
index or the release is refused."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.actions import follow as follow_mod
from agent_fsm.actions.channel import publishing
from agent_fsm.actions.holds import hold
from agent_fsm.errors import Unreachable
from agent_fsm.node.channel import record as channel_record
from agent_fsm.node.channel import rollout
from agent_fsm.node.channel_config import ChannelConfig
from tests.helpers import DEFAULT_CONFIG, World, make_world
from tests.node.test_release_store import make_release

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None,
                                reason="needs OpenSSH's ssh-keygen (Debian: openssh-client)")
URL = "https://updates.example.test/stable"
MACHINE_ID = "0123456789abcdef0123456789abcdef"


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, timeout=30)
    return path


class Server:
    """The channel's directory as an HTTPS server would serve it, and what was asked of it."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.asked, self.down = directory, [], False
        self.swap: dict[str, bytes] = {}  # path -> bytes served in its place

    def _path(self, url: str) -> str:
        assert url.startswith(URL + "/"), url
        return url.removeprefix(URL + "/")

    def get(self, url: str, *, ca: Path | None, limit: int, seconds: float) -> bytes | None:
        path = self._path(url)
        self.asked.append(path)
        if self.down:
            raise Unreachable(f"could not fetch {url}: [Errno 111] Connection refused")
        if path in self.swap:
            return self.swap[path]
        file = self.directory / path
        return file.read_bytes() if file.is_file() else None

    def download(self, url: str, target: Path, *, ca: Path | None, size: int,
                 seconds: float) -> None:
        path = self._path(url)
        self.asked.append(path)
        target.write_bytes(self.swap.get(path) or (self.directory / path).read_bytes())


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "keys").mkdir()
    return {n: keygen(tmp_path / "keys" / n) for n in ("root", "ci")}


@pytest.fixture
def channel(tmp_path: Path, keys: dict[str, Path]) -> Path:
    directory = tmp_path / "stable"
    publishing.init(directory, "stable", root_keys={"root": keys["root"]},
                    index_keys={"ci": keys["ci"]}, threshold=1, now=_now())
    return directory


@pytest.fixture
def world(tmp_path: Path, channel: Path) -> World:
    config = DEFAULT_CONFIG._replace(channel=ChannelConfig(url=URL))
    w = make_world(tmp_path / "root", config).installed("1.0.0")
    root = w.paths.channel_root
    root.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(channel / "root" / "1.json", root)
    w.paths.machine_id.write_text(MACHINE_ID + "\n")
    return w


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def publish(channel: Path, keys: dict[str, Path], version: str, rollout_: int = 100) -> Path:
    release = make_release(channel.parent / "build", version)
    archive = channel.parent / f"{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(release, arcname=release.name)
    publishing.publish(channel, version, rollout=rollout_, keys={"ci": keys["ci"]}, now=_now(),
                       archive=archive)
    return archive


def follow(world: World, server: Server) -> channel_record.Record:
    return follow_mod.follow(world.node, wait=False, get=server.get,
                             download=server.download).record


def state(world: World) -> dict[str, Any]:
    doc = world.node.store.read()
    return {"state": doc.state, "to": None if doc.upgrade is None else doc.upgrade.to_version}


class TestTakes:
    def test_the_newest_eligible_release_is_fetched_added_and_upgraded_to(
            self, world: World, channel: Path, keys: dict[str, Path]) -> None:
        """1.1.0 and 1.2.0 at 100 %: the node fetches 1.2.0 alone, stores it and begins the
        upgrade; the record names the index version and what it took."""
        publish(channel, keys, "1.1.0")
        publish(channel, keys, "1.2.0")
        server = Server(channel)
        rec = follow(world, server)
        assert rec.outcome is channel_record.Outcome.started and rec.took == "1.2.0"
        assert state(world) == {"state": "candidate_running", "to": "1.2.0"}
        assert "releases/1.2.0.tar.gz" in server.asked
        assert "releases/1.1.0.tar.gz" not in server.asked
        assert rec.seen is not None and rec.seen.version == 3
        assert rec.message.startswith("index version 3: 1.0.0 → 1.2.0")

    def test_outside_the_rollout_nothing_is_fetched_and_the_record_says_why(
            self, world: World, channel: Path, keys: dict[str, Path]) -> None:
        """A rollout below this node's bucket: nothing fetched, nothing begun; the record gives
        the rollout and the node's bucket."""
        bucket = rollout.bucket(MACHINE_ID, "1.1.0")
        publish(channel, keys, "1.1.0", rollout_=bucket)  # covers buckets below it: not this one
        server = Server(channel)
        rec = follow(world, server)
        assert rec.outcome is channel_record.Outcome.nothing_eligible
        assert [a.why_not for a in rec.available] == [
            f"rollout {bucket} %, this node's bucket {bucket}"]
        assert not any(p.startswith("releases/") for p in server.asked)
        assert state(world) == {"state": "converged", "to": None}


class TestChangesNothing:
    def test_a_replayed_older_index_is_refused_after_a_newer_one(
            self, world: World, channel: Path, keys: dict[str, Path]) -> None:
        """The node saw index version 2; the server then serves version 1 again: refused, and
        the version seen stays 2."""
        old = (channel / "index.json").read_bytes()
        publish(channel, keys, "1.1.0", rollout_=0)
        server = Server(channel)
        assert follow(world, server).seen.version == 2  # type: ignore[union-attr]
        server.swap["index.json"] = old
        rec = follow(world, server)
        assert rec.outcome is channel_record.Outcome.refused
        assert "older than version 2 this node has seen" in rec.message
        assert rec.seen is not None and rec.seen.version == 2

    def test_a_server_that_is_down_changes_nothing_and_is_tried_again(
            self, world: World, channel: Path, keys: dict[str, Path]) -> None:
        """Down: the follow fails in one line and the node stays; back up: the next follow
        proceeds."""
        publish(channel, keys, "1.1.0")
        server = Server(channel)
        server.down = True
        rec = follow(world, server)
        assert rec.outcome is channel_record.Outcome.failed and "Connection refused" in rec.message
        assert state(world) == {"state": "converged", "to": None}
        server.down = False
        assert follow(world, server).outcome is channel_record.Outcome.started

    def test_a_held_node_fetches_nothing(self, world: World, channel: Path,
                                         keys: dict[str, Path]) -> None:
        """An operator's hold: the eligible version is named, nothing is fetched or begun."""
        publish(channel, keys, "1.1.0")
        hold(world.node, "quarter end", None)
        server = Server(channel)
        rec = follow(world, server)
        assert rec.outcome is channel_record.Outcome.held and "quarter end" in rec.message
        assert not any(p.startswith("releases/") for p in server.asked)
        assert not (world.paths.releases_dir / "1.1.0").exists()

    def test_an_archive_other_than_the_index_names_is_not_stored(
            self, world: World, channel: Path, keys: dict[str, Path], tmp_path: Path) -> None:
        """The server serves another archive under 1.1.0's name: refused by its sha256, and
        nothing is stored or begun."""
        publish(channel, keys, "1.1.0")
        other = make_release(tmp_path / "evil", "1.1.0", marker="evil")
        evil = tmp_path / "evil.tar.gz"
        with tarfile.open(evil, "w:gz") as tar:
            tar.add(other, arcname=other.name)
        server = Server(channel)
        server.swap["releases/1.1.0.tar.gz"] = evil.read_bytes()
        rec = follow(world, server)
        assert rec.outcome is channel_record.Outcome.refused
        assert "has sha256" in rec.message and "not what the index says" in rec.message
        assert not (world.paths.releases_dir / "1.1.0").exists()
        assert state(world) == {"state": "converged", "to": None}

    def test_a_second_follow_at_once_does_nothing(self, world: World, channel: Path,
                                                  keys: dict[str, Path]) -> None:
        """While one follow holds the node's follow lock (the timer's), another (an operator's)
        is refused and asks the server nothing."""
        from agent_fsm.errors import Refused
        from agent_fsm.node.state import lock

        publish(channel, keys, "1.1.0")
        server = Server(channel)
        world.paths.channel_dir.mkdir(mode=0o700, exist_ok=True)
        with lock.held(world.paths.channel_dir / "follow.lock", timeout=1), \
                pytest.raises(Refused, match="another `agent-fsm follow` is running"):
            follow(world, server)
        assert server.asked == []


class TestResultNamesTheChannel:
    def test_a_followed_upgrade_judged_ok_publishes_its_channel_and_index_version(
            self, world: World, channel: Path, keys: dict[str, Path]) -> None:
        """The result of an upgrade `follow` began names the channel and the index version, in
        what was published and in `status`'s last result."""
        from agent_fsm.views.status.report import status

        publish(channel, keys, "1.1.0")
        follow(world, Server(channel))
        for trigger in ("candidate_started", "judge_ok", "complete"):
            world.node.controller.fire(trigger)
        published = world.publisher.published[-1].to_json()
        assert (published["to"], published["outcome"]) == ("1.1.0", "ok")
        assert published["channel"] == {"name": "stable", "index_version": 2}
        assert status(world.node).last_result["channel"] == published["channel"]  # type: ignore[index]

    def test_a_followed_upgrade_rolled_back_names_it_too(
            self, world: World, channel: Path, keys: dict[str, Path]) -> None:
        """Judged failed and rolled back by `recover`: the recorded result names the channel."""
        publish(channel, keys, "1.1.0")
        follow(world, Server(channel))
        world.node.controller.fire("candidate_started")
        world.node.controller.fire("judge_failed", reason="check failed")
        world.node.controller.fire("recover")
        recorded = world.publisher.recorded[-1].to_json()
        assert (recorded["outcome"], recorded["channel"]) == (
            "rolled_back", {"name": "stable", "index_version": 2})

    def test_an_operators_upgrade_names_no_channel(self, world: World) -> None:
        """An upgrade begun by hand has no `channel` in its result."""
        world.add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        for trigger in ("candidate_started", "judge_ok", "complete"):
            world.node.controller.fire(trigger)
        assert "channel" not in world.publisher.published[-1].to_json()
