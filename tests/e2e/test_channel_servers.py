"""A fleet of private-systemd nodes follows one signed channel from real servers: nginx over HTTPS
(a CA made by the test) serves the channel and its archives. The first release reaches every
node by its follow timer alone (a window every 10 s); later scenarios run `agent-fsm follow` by
hand, their timers set far off, so each round is one follow per node at a known moment; the last
one opens one node's window at a set time. Each node is read back through `status --json`.

The nodes (four on the host's systemd 252, two on a Debian 13 node's 257) and the server are made
once for the module; each test builds on the fleet the one before left (the module is one
xdist_group, its tests run in order on one worker: run it alone or with `--dist loadgroup`, as
`make test` does, never split by `--dist load`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent_fsm.actions.channel import publishing, signatures
from agent_fsm.actions.releases import packing
from agent_fsm.actions.releases import trust as release_trust
from agent_fsm.actions.releases.images import CONTAINERFILE
from agent_fsm.node.channel import documents
from agent_fsm.node.channel.rollout import bucket
from agent_fsm_lab import rootfs, servers
from agent_fsm_lab.lab import GOOD_WORKLOAD, NAME, UNIT, Lab, cached
from agent_fsm_lab.sandbox import SystemdSandbox, missing_requirements, python_paths
from tests.e2e.conftest import require_sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("channel-servers")]

KINDS = ("systemd252",) * 4 + ("systemd257",) * 2
GOOD, BAD, NEXT, ROTATED, IMAGE, WINDOWED = "1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0", "1.6.0"
PARTIAL = 34  # the bad release's rollout: some nodes' buckets are under it, some not
SICK_WORKLOAD = ("/bin/sh", "-c", "exec sleep infinity")  # never writes its health file
T = TypeVar("T")
TIMER, SERVICE = f"{NAME}-follow.timer", f"{NAME}-follow.service"
PERIOD, SPREAD = 10, 3  # the nodes' first window: every 10 s, each node up to 3 s after it
WINDOW = f'window = "*:*:0/{PERIOD}"\nspread_seconds = {SPREAD}\n'
FAR_OFF = 'window = "2099-01-01 00:00:00 UTC"\nspread_seconds = 0\n'  # never, in this run


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def machine_ids(count: int) -> list[str]:
    """`count` distinct machine ids, the first third (at least one) with a bucket for BAD under
    PARTIAL and the rest not."""
    under_wanted = max(1, count // 3)
    under: list[str] = []
    over: list[str] = []
    i = 0
    while len(under) < under_wanted or len(over) < count - under_wanted:
        mid = f"{i:032x}"
        (under if bucket(mid, BAD) < PARTIAL else over).append(mid)
        i += 1
    return under[:under_wanted] + over[:count - under_wanted]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True, timeout=30)
    return path


@dataclass
class World:
    dir: Path
    channel: Path
    keys: dict[str, Path]
    web: servers.Nginx
    labs: dict[str, Lab] = field(default_factory=dict)
    under: set[str] = field(default_factory=set)  # the nodes whose bucket for BAD < PARTIAL
    indexes: dict[str, bytes] = field(default_factory=dict)  # index.json as once published
    # Releases are packed and archived one at a time in the background, from the module's start,
    # while the nodes boot and wait: each test takes its own when it publishes it.
    ahead: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))
    made: dict[str, Future[Path]] = field(default_factory=dict)

    def each(self, do: Callable[[Lab], T], names: list[str] | None = None) -> dict[str, T]:
        names = list(self.labs) if names is None else names
        with ThreadPoolExecutor(len(names)) as pool:
            return dict(zip(names, pool.map(do, (self.labs[n] for n in names)), strict=True))

    def follow(self) -> dict[str, subprocess.CompletedProcess[str]]:
        """`agent-fsm follow` on every node at once, as their timers would fire."""
        return self.each(lambda lab: lab.cli("follow", check=False, timeout=240))

    def status(self) -> dict[str, dict[str, Any]]:
        return self.each(Lab.status)

    def make(self, version: str, workload: tuple[str, ...], *, image: bool = False) -> None:
        """Have `version` packed (at build/VERSION) and archived (a .tar.gz, or with `image`
        an OCI archive of its image) in the background."""
        self.made[version] = self.ahead.submit(self._image if image else self._archive, version,
                                               workload)

    def made_release(self, version: str, workload: tuple[str, ...]) -> Path:
        """The archive of `version` (made now if it was not asked for ahead)."""
        if version not in self.made:
            self.make(version, workload)
        return self.made[version].result()

    def _build(self, version: str, workload: tuple[str, ...]) -> Path:
        build = self.dir / "build" / version
        cached(["release", version, "channel", list(workload)], build,
               lambda at: packing.pack(version, at, workload))
        return build

    def _archive(self, version: str, workload: tuple[str, ...]) -> Path:
        build = self._build(version, workload)
        archive = self.dir / "build" / f"{version}.tar.gz"
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:  # 3x faster than 9 here
            tar.add(build, arcname=version)
        return archive

    def _image(self, version: str, workload: tuple[str, ...]) -> Path:
        build = self._build(version, workload)
        context = self.dir / "build" / f"{version}.context"
        shutil.copytree(build, context / "release", symlinks=True)
        (context / "Containerfile").write_text(CONTAINERFILE)
        archive = self.dir / "build" / f"{version}.oci.tar"
        with tempfile.TemporaryDirectory(prefix="afsm-rr-") as runroot:  # podman's: short
            podman = _podman(self.dir / "podman", Path(runroot))
            subprocess.run([*podman, "build", "--quiet", "--file", str(context / "Containerfile"),
                            "--tag", f"localhost/agent:{version}", str(context)], check=True,
                           capture_output=True, timeout=120)
            subprocess.run([*podman, "save", "--format", "oci-archive", "--output",
                            str(archive), f"localhost/agent:{version}"], check=True,
                           capture_output=True, timeout=120)
        return archive

    def publish(self, version: str, rollout: int, workload: tuple[str, ...],
                key: str = "ci") -> None:
        archive = self.made_release(version, workload)
        publishing.publish(self.channel, version, rollout=rollout, keys={key: self.keys[key]},
                           now=_now(), archive=archive)
        self.indexes[version] = (self.channel / "index.json").read_bytes()

    def fetched(self, version: str) -> int:
        """How many GETs of `version`'s archive the server has answered."""
        return sum(1 for p in self.web.asked() if p.startswith(f"/stable/releases/{version}"))


def _boot(kind: str, node: rootfs.Node | None) -> SystemdSandbox:
    sandbox = SystemdSandbox(keep=python_paths()) if node is None else rootfs.sandbox(node)
    try:
        sandbox.boot()
    except BaseException:
        sandbox.shutdown()
        raise
    return sandbox


def _node(sandbox: SystemdSandbox, url: str, world: World, machine_id: str) -> Lab:
    lab = Lab(sandbox, deadline=3, soak=0.5, max_attempts=1)
    shutil.copy(world.dir / "tls" / "ca.crt", lab.dir / "ca.crt")
    shutil.copy(world.channel / "root" / "1.json", lab.dir / "channel-root.json")
    (lab.dir / "machine-id").write_text(machine_id + "\n")
    with lab.config.open("a") as f:
        f.write(f'[channel]\nurl = "{url}/stable"\nca = "{lab.dir / "ca.crt"}"\n'
                f'root = "{lab.dir / "channel-root.json"}"\n'
                f'machine_id = "{lab.dir / "machine-id"}"\ntimeout_seconds = 4\n{WINDOW}')
    lab.pack("1.0.0")
    lab.install("1.0.0")
    return lab


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory,
          request: pytest.FixtureRequest) -> Iterator[World]:
    """Six nodes on 1.0.0 following https://127.0.0.1:PORT/stable, an empty channel there."""
    require_sandbox(*servers.missing(), *([] if shutil.which("ssh-keygen") else
                                          ["ssh-keygen (Debian: openssh-client)"]),
                    what="the channel's e2e test needs")
    node257: rootfs.Node = request.getfixturevalue("debian13_node")
    require_sandbox(*missing_requirements(node257.rootfs), what="the Debian 13 node needs")
    base = tmp_path_factory.mktemp("channel-servers")
    base.chmod(0o755)
    (base / "keys").mkdir()
    keys = {n: keygen(base / "keys" / n) for n in ("root", "backup", "ci", "ci2", "stranger")}
    channel = base / "www" / "stable"
    publishing.init(channel, "stable", root_keys={"root": keys["root"], "backup": keys["backup"]},
                    index_keys={"ci": keys["ci"]}, threshold=1, now=_now())
    ca = servers.TestCA.make(base / "tls")
    web = servers.Nginx(base / "nginx", served=base / "www", ca=ca)
    world = World(base, channel, keys, web)
    for version, workload in ((GOOD, GOOD_WORKLOAD), (BAD, SICK_WORKLOAD),
                              (NEXT, GOOD_WORKLOAD), (ROTATED, GOOD_WORKLOAD)):
        world.make(version, workload)
    world.make(IMAGE, GOOD_WORKLOAD, image=True)
    world.make(WINDOWED, GOOD_WORKLOAD)
    sandboxes: list[SystemdSandbox] = []
    started = time.monotonic()
    try:
        web.start()
        with ThreadPoolExecutor(len(KINDS)) as pool:
            futures = [pool.submit(_boot, k, None if k == "systemd252" else node257)
                       for k in KINDS]
            for f in futures:
                with contextlib.suppress(Exception):
                    sandboxes.append(f.result())
        if len(sandboxes) != len(KINDS):
            pytest.fail("not every node booted", pytrace=False)
        ids = machine_ids(len(KINDS))
        names = [f"n{i + 1}-{k.removeprefix('systemd')}" for i, k in enumerate(KINDS)]
        with ThreadPoolExecutor(len(KINDS)) as pool:
            labs = list(pool.map(lambda a: _node(a[0], web.url, world, a[1]),
                                 zip(sandboxes, ids, strict=True)))
        world.labs = dict(zip(names, labs, strict=True))
        world.under = {n for n, mid in zip(names, ids, strict=True) if bucket(mid, BAD) < PARTIAL}
        print(f"six nodes booted and on 1.0.0 in {time.monotonic() - started:.1f} s")
        yield world
    finally:
        world.ahead.shutdown(cancel_futures=True)
        web.stop()
        with ThreadPoolExecutor(max(1, len(sandboxes))) as pool:
            list(pool.map(lambda s: s.shutdown(), sandboxes))


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _settled(status: dict[str, Any]) -> tuple[Any, ...]:
    return status["state"], status["selected"], status["last_good"]


def _record(lab: Lab) -> dict[str, Any]:
    """The node's record of its last follow, as it is on disk (`status` shows it)."""
    path = lab.state_dir / "channel" / "follow.json"
    return json.loads(path.read_bytes()) if path.exists() else {}


def _window(lab: Lab, window: str) -> None:
    """`window` (and its spread) in the node's config, its timer rewritten and restarted by
    the agent's next start, as for an operator who changed it."""
    text = lab.config.read_text()
    lab.config.write_text(text.replace(WINDOW, window).replace(FAR_OFF, window))
    lab.sb.systemctl("restart", UNIT)
    unit = lab.sb.host_path(f"/etc/systemd/system/{TIMER}")
    lab.sb.wait_for(lambda: window.splitlines()[0].split('"')[1] in unit.read_text()
                    and lab.sb.show(TIMER, "ActiveState") == "active", 60,
                    "the follow timer rewritten by the agent's start", units=(UNIT, TIMER))


def test_a_good_release_at_100_reaches_every_node_within_one_timer_period(world: World) -> None:
    """1.1.0 published at 100 %, no command run on the nodes: each node's follow timer (a window
    every 10 s, up to 3 s after it) runs a follow within one period and the spread, which
    upgrades the node, judged ok; the follow service's journal has it and status its record."""
    world.publish(GOOD, 100, GOOD_WORKLOAD)
    published = time.time()  # the index is written last: the release is servable from now

    def by_the_timer(lab: Lab) -> None:
        rec: dict[str, Any] = {}

        def took() -> bool:
            nonlocal rec
            rec = _record(lab)
            return rec.get("outcome") == "upgraded" and rec.get("took") == GOOD

        lab.sb.wait_for(took, PERIOD + SPREAD + 120, "a follow by the timer taking 1.1.0",
                        units=(TIMER, SERVICE, UNIT))
        # Later scenarios follow by hand: no follow of the timer's meets theirs from now on.
        lab.sb.systemctl("stop", TIMER, SERVICE)

    world.each(by_the_timer)
    for name, status in world.status().items():
        assert _settled(status) == ("converged", GOOD, GOOD), (name, status)
        channel = status["channel"]
        assert channel["outcome"] == "upgraded" and channel["took"] == GOOD, (name, channel)
        # Its follow began within one period and the spread of the publish (and AccuracySec=1s
        # and agent-fsm's start on a loaded host: 5 s; a missed period would be 10 s more).
        assert channel["time"] <= published + PERIOD + SPREAD + 5, (name, channel, published)
    for name, journal in world.each(lambda lab: lab.sb.journal(SERVICE)).items():
        assert f"→ {GOOD}" in journal and "judged ok" in journal, (name, journal)
    assert world.fetched(GOOD) == len(world.labs)
    for lab in world.labs.values():  # written by the agent's next start: never, in this run
        lab.config.write_text(lab.config.read_text().replace(WINDOW, FAR_OFF))


def test_a_failing_release_at_34_reaches_only_the_nodes_under_34(world: World) -> None:
    """1.2.0, whose check fails, at 34 %: only the nodes whose bucket is under 34 take it, roll
    back to 1.1.0 and mark it known bad; the others never fetch it; once it is revoked (and its
    rollout raised to 100), no node takes it."""
    assert world.under and world.under != set(world.labs)
    world.publish(BAD, PARTIAL, SICK_WORKLOAD)
    runs = world.follow()
    for name, proc in runs.items():
        want = 4 if name in world.under else 0  # 4: judged failed, rolled back
        assert proc.returncode == want, (name, proc.stdout, proc.stderr)
    assert world.fetched(BAD) == len(world.under)
    for name, status in world.status().items():
        assert _settled(status) == ("converged", GOOD, GOOD), (name, status)
        marked = [m["version"] for m in status["known_bad"]]
        if name in world.under:
            assert status["channel"]["outcome"] == "rolled_back", (name, status["channel"])
            assert marked == [BAD], (name, status["known_bad"])
        else:
            assert status["channel"]["outcome"] == "up_to_date", (name, status["channel"])
            assert marked == [], (name, status["known_bad"])

    publishing.revoke(world.channel, BAD, "fails its health check", keys={"ci": world.keys["ci"]},
                      now=_now())
    publishing.set_rollout(world.channel, BAD, 100, keys={"ci": world.keys["ci"]}, now=_now())
    runs = world.follow()
    for name, proc in runs.items():
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
    assert world.fetched(BAD) == len(world.under)
    for name, status in world.status().items():
        assert _settled(status) == ("converged", GOOD, GOOD), (name, status)
        assert status["channel"]["outcome"] == "up_to_date", (name, status["channel"])


def _variant(world: World, name: str, change: Callable[[Path], object]) -> bytes:
    """index.json of a scratch copy of the channel after `change`, the served channel as it was."""
    scratch = world.dir / "variants" / name
    shutil.copytree(world.channel, scratch)
    change(scratch)
    return (scratch / "index.json").read_bytes()


def _stranger(scratch: Path, keys: dict[str, Path]) -> None:
    """The index, one version on, signed by a key the root does not name (under a name it does)."""
    env = documents.read_envelope((scratch / "index.json").read_bytes(), "index")
    body = {**env.body, "version": int(env.body["version"]) + 1}
    (scratch / "index.json").write_bytes(signatures.sign(body, {"ci": keys["stranger"]}))


def _tampered(data: bytes) -> bytes:
    top = json.loads(data)
    top["signed"]["releases"][0]["rollout"] = 100 - top["signed"]["releases"][0]["rollout"]
    return json.dumps(top).encode() + b"\n"


def _unsigned(data: bytes) -> bytes:
    top = json.loads(data)
    top["signatures"] = []
    return json.dumps(top).encode() + b"\n"


def test_bad_indexes_and_a_slow_server_are_refused_in_one_line_and_change_nothing(
        world: World) -> None:
    """A replayed older index, an expired one, a tampered one, an unsigned one, one signed by an
    untrusted key, an oversized one (each on two 252 nodes and one 257, three rounds of six at
    once, each node its own copy of the channel) and a server that drips a byte a second: each
    follow exits 1 with one line saying why, and no node changes (state, releases, the newest
    index believed)."""
    served = world.channel / "index.json"
    good = served.read_bytes()
    ci = {"ci": world.keys["ci"]}
    bad = {
        "replayed": (world.indexes[GOOD], "older"),
        "expired": (_variant(world, "expired", lambda d: publishing.refresh(
            d, keys=ci, now=_now() - timedelta(days=3), days=1)), "expired"),
        "tampered": (_tampered(good), "signature"),
        "unsigned": (_unsigned(good), "signature"),
        "stranger": (_variant(world, "stranger", lambda d: _stranger(d, world.keys)),
                     "signature"),
        "oversized": (b" " * (documents.MAX_DOCUMENT + 1), "larger than"),
    }
    variants = list(bad)
    names = list(world.labs)
    for name in names:  # the node's own channel: the served roots, and an index of its own
        own = world.dir / "www" / "each" / name / "stable"
        own.mkdir(parents=True)
        (own / "root").symlink_to(world.channel / "root")
        (own / "root.json").symlink_to(world.channel / "root.json")
    before = world.status()
    try:
        for lab, name in zip(world.labs.values(), names, strict=True):
            lab.config.write_text(lab.config.read_text().replace(
                "/stable\"", f"/each/{name}/stable\""))
        # Round r gives node i variant (i + 2r) % 6: over three rounds every variant meets two
        # 252 nodes and one 257 (the last two nodes).
        for r in range(3):
            given = {n: variants[(i + 2 * r) % len(variants)] for i, n in enumerate(names)}
            for name, what in given.items():
                (world.dir / "www" / "each" / name / "stable" / "index.json").write_bytes(
                    bad[what][0])
            for name, proc in world.follow().items():
                what, reason = given[name], bad[given[name]][1]
                assert proc.returncode == 1, (what, name, proc.stdout, proc.stderr)
                line = _one_line(proc)
                assert reason in line and "nothing changed" in line, (what, name, line)
        for lab, name in zip(world.labs.values(), names, strict=True):
            lab.config.write_text(lab.config.read_text().replace(
                f"/each/{name}/stable\"", "/stable\""))
        for lab in world.labs.values():
            text = lab.config.read_text()
            lab.config.write_text(text.replace("/stable\"", "/drip/stable\""))
        for name, proc in world.follow().items():
            assert proc.returncode == 1, ("drip", name, proc.stdout, proc.stderr)
            line = _one_line(proc)
            assert "did not answer in time" in line and "the next follow tries again" in line, (name, line)
    finally:
        for lab, name in zip(world.labs.values(), names, strict=True):
            lab.config.write_text(lab.config.read_text().replace(
                f"/each/{name}/stable\"", "/stable\"").replace("/drip/stable\"", "/stable\""))
    after = world.status()
    for name in world.labs:
        keep = ("state", "selected", "last_good", "releases", "known_bad")
        assert {k: after[name][k] for k in keep} == {k: before[name][k] for k in keep}, name
        assert after[name]["channel"]["seen"] == before[name]["channel"]["seen"], name


def test_the_server_down_changes_nothing_and_the_next_follow_proceeds(world: World) -> None:
    """With the server down, a follow exits 1 saying it will try again, and nothing changes;
    once it is back, the next follow takes 1.3.0 on every node."""
    world.publish(NEXT, 100, GOOD_WORKLOAD)
    before = world.status()
    world.web.stop()
    try:
        for name, proc in world.follow().items():
            assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
            line = _one_line(proc)
            assert "the next follow tries again" in line, (name, line)
        after = world.status()
        for name in world.labs:
            assert _settled(after[name]) == _settled(before[name]) == (
                "converged", GOOD, GOOD), name
            assert after[name]["releases"] == before[name]["releases"], name
    finally:
        world.web.start()
    for name, proc in world.follow().items():
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
    for name, status in world.status().items():
        assert _settled(status) == ("converged", NEXT, NEXT), (name, status)


def test_nodes_running_a_revoked_version_go_judged_to_the_newest_eligible(world: World) -> None:
    """1.3.0 revoked while every node runs it: the next follow takes each, judged ok, to 1.1.0,
    the newest version neither revoked nor known bad."""
    publishing.revoke(world.channel, NEXT, "a data bug", keys={"ci": world.keys["ci"]},
                      now=_now())
    for name, proc in world.follow().items():
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
    for name, status in world.status().items():
        assert _settled(status) == ("converged", GOOD, GOOD), (name, status)
        assert status["channel"]["outcome"] == "upgraded", (name, status["channel"])


def test_a_rotated_key_is_followed_and_a_held_node_waits_for_its_hold_to_end(
        world: World) -> None:
    """The root rotated to the backup key and a new CI key, and 1.4.0 signed by that key: every
    node chains to root version 2 by itself and takes 1.4.0, except a held node, which fetches
    nothing (exit 3) until `unhold`, when its next follow takes it."""
    keys = world.keys
    publishing.rotate(world.channel, root_keys={"backup": keys["backup"]},
                      index_keys={"ci2": keys["ci2"]}, threshold=1,
                      sign_with={"root": keys["root"], "backup": keys["backup"]}, now=_now())
    newest = ROTATED
    world.publish(newest, 100, GOOD_WORKLOAD, key="ci2")
    held = next(iter(world.labs))
    world.labs[held].cli("hold", "--reason", "quarter-end batch")
    runs = world.follow()
    for name, proc in runs.items():
        assert proc.returncode == (3 if name == held else 0), (name, proc.stdout, proc.stderr)
    assert world.fetched(newest) == len(world.labs) - 1
    for name, status in world.status().items():
        assert status["channel"]["root_version"] == 2, (name, status["channel"])
        want = GOOD if name == held else newest
        assert _settled(status) == ("converged", want, want), (name, status)
    assert "quarter-end batch" in runs[held].stderr, runs[held].stderr

    world.labs[held].cli("unhold")
    proc = world.labs[held].cli("follow", check=False, timeout=240)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert _settled(world.labs[held].status()) == ("converged", newest, newest)


def _podman(store: Path, runroot: Path) -> list[str]:
    return ["podman", "--root", str(store), "--runroot", str(runroot), "--storage-driver",
            "overlay"]


def test_a_release_as_an_image_is_pulled_from_a_real_registry(world: World) -> None:
    """1.5.0 as an image pushed (skopeo) to a real OCI registry and published by reference: the
    nodes with podman (252) pull it, store it and take it, judged ok; the nodes without it (the
    Debian 13 node has none) refuse in one line and stay as they were."""
    version = IMAGE
    archive = world.made_release(version, GOOD_WORKLOAD)
    build = world.dir / "build" / version
    registry = servers.Registry(world.dir / "registry")
    registry.start()
    try:
        ref = f"docker://{registry.address}/agent:{version}"
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false",
                        f"oci-archive:{archive}", ref], check=True, capture_output=True,
                       timeout=120)
        publishing.publish(world.channel, version, rollout=100, keys={"ci2": world.keys["ci2"]},
                           now=_now(), image=ref, digest=release_trust.digest(build))
        with_podman = [n for n in world.labs if n.endswith("-252")]
        for name in with_podman:
            lab = world.labs[name]
            conf = lab.dir / "registries.conf"
            conf.write_text(f'[[registry]]\nlocation = "{registry.address}"\ninsecure = true\n')
            prefix = ["/usr/bin/env", f"CONTAINERS_REGISTRIES_CONF={conf}",
                      *_podman(lab.dir / "podman", Path("/run/agent-fsm-e2e-podman"))]
            lab.config.write_text(f"podman = {json.dumps(prefix)}\n" + lab.config.read_text())
        before = world.status()
        runs = world.follow()
        after = world.status()
    finally:
        registry.stop()
    for name, proc in runs.items():
        if name in with_podman:
            assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
            assert _settled(after[name]) == ("converged", version, version), (name, after[name])
        else:
            assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
            assert "podman" in _one_line(proc), (name, proc.stderr)
            assert _settled(after[name]) == _settled(before[name]), name
            assert after[name]["releases"] == before[name]["releases"], name


def test_a_node_outside_its_window_is_untouched_until_it_opens(world: World) -> None:
    """1.6.0 at 100 % and one node whose window opens 20 s on (the others' far off): until then
    it fetches nothing and stays as it was, and status says it is outside the window, next at
    its opening (and 1.5.0, the image it could not take, eligible and not taken yet); when the
    window opens, its timer's follow takes 1.6.0, judged ok, with no command run on it."""
    lab = world.labs["n6-257"]
    before = _settled(lab.status())
    opens = int(time.time()) + 20
    _window(lab, f'window = "{time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(opens))} UTC"\n'
            "spread_seconds = 0\n")
    asked = len(world.web.asked())
    world.publish(WINDOWED, 100, GOOD_WORKLOAD, key="ci2")
    status = lab.status()
    shown = lab.cli("status").stdout
    assert len(world.web.asked()) == asked and world.fetched("1.6.0") == 0
    assert _settled(status) == before, status
    assert status["channel"]["waiting"] == {"reason": "outside the window", "next_run": opens,
                                            "eligible": ["1.5.0"]}, status["channel"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(opens))
    assert f"follow timer active: outside the window: next at {stamp}" in shown, shown
    assert f"1.5.0: eligible, not taken yet: outside the window: next at {stamp}" in shown, shown

    lab.sb.wait_for(lambda: _record(lab).get("took") == WINDOWED, 20 + 120,
                    "the follow of the window's opening taking 1.6.0", units=(TIMER, SERVICE, UNIT))
    status = lab.status()
    assert _settled(status) == ("converged", "1.6.0", "1.6.0"), status
    assert status["channel"]["outcome"] == "upgraded", status["channel"]
    assert status["channel"]["time"] >= opens, (status["channel"], opens)
    assert world.fetched("1.6.0") == 1
    assert "→ 1.6.0" in lab.sb.journal(SERVICE)
