"""Releases from OCI images and image retention: references, what is recorded, what prune removes
(podman faked only as a process: `tests/fake_podman.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.actions.releases import images as image_releases
from agent_fsm.actions.releases import origins
from agent_fsm.actions.releases.pruning import prune
from agent_fsm.errors import ConfigError, ReleaseError
from agent_fsm.node.config import parse
from agent_fsm.system.podman import ImageRef, parse_reference
from tests.helpers import DEFAULT_CONFIG, World, make_world, one_line

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fake_podman.py"


def _id(n: int) -> str:
    return f"{n:064x}"


class Store:
    """The fake podman's store and what it was asked, in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.save({"images": {}, "calls": [], "fail": {}, "busy": []})

    def load(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data

    def save(self, data: dict[str, Any]) -> None:
        self.path.write_text(json.dumps(data))

    def change(self, key: str, value: Any) -> None:
        data = self.load()
        data[key] = value
        self.save(data)

    def ids(self) -> set[str]:
        return set(self.load()["images"])

    def verbs(self) -> list[str]:
        return [c[0] if c[0] != "image" else f"image {c[1]}" for c in self.load()["calls"]]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "podman.json")


@pytest.fixture
def node(tmp_path: Path, store: Store) -> World:
    config = DEFAULT_CONFIG._replace(podman=(sys.executable, str(FAKE), str(store.path)))
    return make_world(tmp_path / "root", config)


def _tree(base: Path, version: str) -> Path:
    """A mounted release image's file system: the release at /agent-fsm/release."""
    release = base / version / "agent-fsm" / "release"
    (release / "assets").mkdir(parents=True)
    packaged = resources.files("agent_fsm") / "templates"
    for name in ("agent.service", "recovery.service", "recovery.sh"):
        (release / "assets" / name).write_text((packaged / name).read_text())
    (release / "release.toml").write_text(f'version = "{version}"\n')
    (release / "bin").mkdir()
    (release / "bin" / "agent-fsm").write_text("#!/bin/sh\n")
    (release / "bin" / "agent-fsm").chmod(0o755)
    return base / version


def _archive(tmp_path: Path, version: str, n: int) -> ImageRef:
    """An `oci-archive:` the fake podman pulls as image `_id(n)` holding release `version`."""
    path = tmp_path / f"{version}.tar"
    path.write_text(json.dumps({"id": _id(n), "tree": str(_tree(tmp_path / "trees", version))}))
    return ImageRef("oci-archive", str(path))


def _in_store(store: Store, tmp_path: Path, version: str, n: int, name: str) -> ImageRef:
    data = store.load()
    data["images"][_id(n)] = {"names": [name], "tree": str(_tree(tmp_path / "trees", version))}
    store.save(data)
    return ImageRef("containers-storage", name)


def _cli(world: World, store: Store, *args: str,
         progress: str | None = None) -> subprocess.CompletedProcess[str]:
    cfg = world.root.parent / "config.toml"
    cfg.write_text('name = "agent"\npodman = ' + json.dumps([sys.executable, str(FAKE),
                                                              str(store.path)]) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    env["COLUMNS"] = "250"
    if progress is not None:
        env["AGENT_FSM_PROGRESS_SECONDS"] = progress
    return subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "--root",
                           str(world.root), *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60, check=False)


class TestReferences:
    def test_the_four_transports_are_images_anything_else_a_directory(
            self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """`release add` takes oci-archive:, docker-archive: (made absolute), containers-storage:
        and docker:// as images; a plain path is a release directory."""
        monkeypatch.chdir(tmp_path)
        assert parse_reference("oci-archive:r.tar") == ImageRef("oci-archive", f"{tmp_path}/r.tar")
        assert parse_reference("docker-archive:/x/r.tar") == ImageRef("docker-archive", "/x/r.tar")
        ref = parse_reference("containers-storage:localhost/agent:2.0.0")
        assert ref == ImageRef("containers-storage", "localhost/agent:2.0.0")
        assert str(ref) == "containers-storage:localhost/agent:2.0.0"
        registry = parse_reference("docker://quay.io/org/agent:2.0.0")
        assert registry == ImageRef("docker", "quay.io/org/agent:2.0.0")
        assert str(registry) == "docker://quay.io/org/agent:2.0.0"
        for directory in ("./agent-fsm-2.0.0", "/srv/rel", "rel", "./oci-archive:x", "a:b"):
            assert parse_reference(directory) is None

    @pytest.mark.parametrize(("text", "says"), [
        ("oci:/srv/layout", "does not take podman's oci: transport"),
        ("dir:/srv/x", "does not take podman's dir: transport"),
        ("oci-archive:", "give oci-archive:FILE"),
        ("containers-storage:", "give containers-storage:REF"),
        ("docker://", "give docker://REF"),
        ("containers-storage:a b", "without spaces"),
        ("containers-storage:--all", "cannot start with '-'"),
    ])
    def test_bad_references_refused_saying_why(self, text: str, says: str) -> None:
        """A transport agent-fsm does not take, or one with nothing usable after it, is refused
        with a message that names it and what to give."""
        with pytest.raises(ReleaseError) as raised:
            parse_reference(text)
        assert says in str(raised.value)

    def test_bad_reference_on_the_command_line_is_one_line_exit_1(self, node: World,
                                                                   store: Store) -> None:
        """`release add oci:DIR` exits 1 with one line, and podman is never run."""
        proc = _cli(node, store, "release", "add", "oci:/srv/layout")
        assert proc.returncode == 1
        assert "oci: transport" in one_line(proc)
        assert store.verbs() == []


    def test_pack_image_usage_errors_exit_2(self, node: World, store: Store) -> None:
        """`release pack` wants --output or --image, and will not push to a registry (exit 2,
        saying what to do instead); podman is not run."""
        proc = _cli(node, store, "release", "pack", "--version", "2.0.0")
        assert proc.returncode == 2 and "give --output DIR, --image REF, or both" in proc.stderr
        proc = _cli(node, store, "release", "pack", "--version", "2.0.0", "--image",
                    "docker://quay.io/x/agent:2")
        assert proc.returncode == 2 and "podman push" in proc.stderr
        assert store.verbs() == []


class TestConfig:
    def test_podman_prefix_default_and_given(self) -> None:
        """`podman` defaults to ["podman"]; a prefix with a private store is taken as given."""
        source = Path("/etc/agent-fsm/config.toml")
        assert parse({}, source).podman == ("podman",)
        argv = ["/usr/bin/podman", "--root", "/srv/s", "--runroot", "/run/s"]
        assert parse({"podman": argv}, source).podman == tuple(argv)

    @pytest.mark.parametrize("value", [[], "podman", ["./podman"], ["bin/podman"], [""], [1]])
    def test_bad_podman_prefix_refused_naming_the_key(self, value: Any) -> None:
        """A `podman` that is not a non-empty argv starting with an absolute path or a command
        name is refused, naming the key and the value."""
        with pytest.raises(ConfigError, match=r"`podman` is .*; expected .*list of strings"):
            parse({"podman": value}, Path("/etc/agent-fsm/config.toml"))


class TestAdd:
    def test_archive_pulled_stored_and_recorded_as_added(self, node: World, store: Store,
                                                         tmp_path: Path) -> None:
        """An oci-archive is pulled, its release stored through the normalizing copy, the
        image's id recorded as added by agent-fsm, and the mount released again."""
        done = image_releases.add(_archive(tmp_path, "1.0.0", 1), node.node)
        assert done.release.version == "1.0.0" and not done.release.already
        assert done.image.id == "sha256:" + _id(1) and done.image.added
        assert done.image.digest == "sha256:" + _id(1)[::-1]  # the manifest's, as podman says
        assert node.node.releases.versions() == ["1.0.0"]
        assert origins.read(node.node, "1.0.0") == (done.image,)
        verbs = store.verbs()
        assert verbs[:2] == ["images", "pull"] and verbs[-2:] == ["image mount", "image unmount"]

    def test_a_pull_says_what_podman_says_of_it_as_it_goes(self, node: World, store: Store,
                                                          tmp_path: Path) -> None:
        """Piped, `release add oci-archive:FILE` prints podman's own words on the pull, one
        timestamped line each (`pulling REF: Copying blob sha256:…`), then the copy's lines;
        stdout keeps the result alone."""
        ref = _archive(tmp_path, "1.0.0", 1)
        done = _cli(node, store, "release", "add", str(ref), progress="0")
        assert done.returncode == 0, done.stderr
        pulled = [line for line in done.stderr.splitlines() if f" pulling {ref}: " in line]
        assert any(line.endswith(f"Copying blob sha256:{_id(1)}") for line in pulled), done.stderr
        assert "stored at" in done.stdout and "pulling" not in done.stdout

    def test_image_already_in_the_store_is_not_added(self, node: World, store: Store,
                                                     tmp_path: Path) -> None:
        """A containers-storage: image was in podman's store before: recorded, not as added,
        and nothing is pulled."""
        ref = _in_store(store, tmp_path, "2.0.0", 2, "localhost/agent:2.0.0")
        done = image_releases.add(ref, node.node)
        assert not done.image.added and "pull" not in store.verbs()
        # The same image then given as an archive: still not agent-fsm's to remove.
        path = tmp_path / "same.tar"
        path.write_text(json.dumps({"id": _id(2), "tree": str(tmp_path / "trees" / "2.0.0")}))
        again = image_releases.add(ImageRef("oci-archive", str(path)), node.node)
        assert again.release.already and not again.image.added
        assert [i.added for i in origins.read(node.node, "2.0.0")] == [False]

    def test_image_added_by_agent_fsm_stays_so_when_added_again(self, node: World, store: Store,
                                                               tmp_path: Path) -> None:
        """Adding an image agent-fsm pulled once more (now in the store) keeps it agent-fsm's
        to remove."""
        ref = _archive(tmp_path, "1.0.0", 1)
        image_releases.add(ref, node.node)
        again = image_releases.add(ref, node.node)
        assert again.release.already and not again.image.added
        assert origins.read(node.node, "1.0.0") == (
            origins.Image(str(ref), "sha256:" + _id(1), "sha256:" + _id(1)[::-1], True),)

    def test_missing_image_or_archive_exit_1one_line(self, node: World, store: Store,
                                                      tmp_path: Path) -> None:
        """An image not in the store, or an archive that does not exist, is one line, exit 1,
        and nothing is stored."""
        proc = _cli(node, store, "release", "add", "containers-storage:localhost/nope:1")
        assert proc.returncode == 1
        assert "image localhost/nope:1 is not in podman's store" in one_line(proc)
        with pytest.raises(ReleaseError, match=f"image archive {tmp_path}/none.tar does not exist"):
            image_releases.add(ImageRef("oci-archive", f"{tmp_path}/none.tar"), node.node)
        assert node.node.releases.versions() == []

    def test_podman_failing_or_missing_isone_line(self, node: World, store: Store,
                                                   tmp_path: Path) -> None:
        """podman's own error becomes one line (exit 1) quoting it; a podman that cannot run
        says so and points at the `podman` config key."""
        ref = _archive(tmp_path, "1.0.0", 1)
        store.change("fail", {"pull": "writing blob: no space left on device"})
        proc = _cli(node, store, "release", "add", str(ref))
        assert proc.returncode == 1
        assert one_line(proc) == (f"agent-fsm: could not pull {ref} into podman's store: podman "
                                   "said: writing blob: no space left on device")
        gone = node.node.config._replace(podman=("/nonexistent/podman",))
        with pytest.raises(ReleaseError, match=r"could not run .*set the `podman` config key"):
            image_releases.add(ref, make_world(node.root, gone).node)

    @pytest.mark.parametrize("layout", ["none", "symlink", "file"])
    def test_image_without_a_release_dir_refused_and_pulled_image_removed(
            self, node: World, store: Store, tmp_path: Path, layout: str) -> None:
        """An image with no directory at /agent-fsm/release (missing, a symlink, a file) is
        refused naming the path, nothing is stored, and the image it pulled is removed again."""
        ref = _archive(tmp_path, "1.0.0", 1)
        top = tmp_path / "trees" / "1.0.0" / "agent-fsm"
        release = top / "release"
        os.rename(release, tmp_path / "elsewhere")
        if layout == "symlink":  # would point the copy at a tree outside the image
            release.symlink_to(tmp_path / "elsewhere")
        elif layout == "file":
            release.write_text("")
        with pytest.raises(ReleaseError, match=f"image {ref}.*/agent-fsm/release") as raised:
            image_releases.add(ref, node.node)
        assert "nothing was stored" in str(raised.value)
        assert node.node.releases.versions() == [] and store.ids() == set()

    def test_refused_release_names_the_image(self, node: World, store: Store,
                                             tmp_path: Path) -> None:
        """A release in an image that the store refuses is named by the image's reference, not
        by where podman mounted it."""
        ref = _archive(tmp_path, "1.0.0", 1)
        release = tmp_path / "trees" / "1.0.0" / "agent-fsm" / "release"
        (release / "assets" / "link").symlink_to("/etc/shadow")
        with pytest.raises(ReleaseError) as raised:
            image_releases.add(ref, node.node)
        text = str(raised.value)
        assert f"refusing release {ref} (/agent-fsm/release)" in text and str(tmp_path /
                                                                              "trees") not in text


class TestRetention:
    def _three(self, node: World, store: Store, tmp_path: Path) -> None:
        """As `release add` leaves them: 1.0.0 and 3.0.0 from archives (added), 2.0.0 from the
        store (not added); 2.0.0 is installed, so 1.0.0 is old and 3.0.0 staged."""
        data = store.load()
        for n, (version, ref, added) in enumerate([
                ("1.0.0", f"oci-archive:{tmp_path}/1.0.0.tar", True),
                ("2.0.0", "containers-storage:localhost/a:2", False),
                ("3.0.0", f"oci-archive:{tmp_path}/3.0.0.tar", True)], start=1):
            node.add_release(version)
            origins.write(node.node, version, (origins.Image(ref, "sha256:" + _id(n), "", added),))
            data["images"][_id(n)] = {"names": [], "tree": ""}
        store.save(data)
        node.installed("2.0.0")

    def test_prune_removes_only_images_it_added_of_releases_it_removes(
            self, node: World, store: Store, tmp_path: Path) -> None:
        """prune removes the added image of each release it removes, keeps the images of the
        releases it keeps, and never removes one it did not add."""
        self._three(node, store, tmp_path)
        done = prune(node.node)
        assert done.removed == ("1.0.0",)
        assert [(v, i.id) for v, i in done.images.removed] == [("1.0.0", "sha256:" + _id(1))]
        assert store.ids() == {_id(2), _id(3)}
        assert origins.read(node.node, "1.0.0") == ()
        everything = prune(node.node, keep=0)  # the selected 2.0.0 stays; 3.0.0 goes
        assert everything.removed == ("3.0.0",) and store.ids() == {_id(2)}
        node.add_release("4.0.0")
        node.node.controller.fire("activate", release="4.0.0")
        last = prune(node.node, keep=0)
        assert last.removed == ("2.0.0",) and store.ids() == {_id(2)}
        assert [(v, why) for v, _, why in last.images.kept] == [("2.0.0", (origins.NOT_ADDED,))]

    def test_dry_run_and_json_show_image_removals(self, node: World, store: Store,
                                                  tmp_path: Path) -> None:
        """--dry-run says which images would go and removes none; --json lists them; `release
        list --json` shows each release's images."""
        self._three(node, store, tmp_path)
        listed = json.loads(_cli(node, store, "release", "list", "--json").stdout)
        assert listed[0]["images"] == [
            {"reference": f"oci-archive:{tmp_path}/1.0.0.tar", "id": "sha256:" + _id(1),
             "digest": "", "added": True}]
        assert [i["added"] for r in listed for i in r["images"]] == [True, False, True]
        proc = _cli(node, store, "release", "prune", "--dry-run")
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert f"would remove image sha256:{_id(1)} of 1.0.0 (oci-archive:{tmp_path}/1.0.0.tar)" in lines
        assert f"kept image sha256:{_id(2)} of 2.0.0 (selected, last-good)" in lines
        assert store.ids() == {_id(1), _id(2), _id(3)}
        data = json.loads(_cli(node, store, "release", "prune", "--json").stdout)
        assert [(i["version"], i["added"]) for i in data["images"]["removed"]] == [("1.0.0", True)]
        assert [i["version"] for i in data["images"]["kept"]] == ["2.0.0", "3.0.0"]
        assert store.ids() == {_id(2), _id(3)}

    def test_image_podman_will_not_remove_stays_recorded_exit_1(self, node: World, store: Store,
                                                                tmp_path: Path) -> None:
        """An image podman refuses to remove (a container uses it) is named in one line,
        exit 1; it stays recorded, and the next prune removes it."""
        self._three(node, store, tmp_path)
        store.change("busy", [_id(1)])
        proc = _cli(node, store, "release", "prune")
        assert proc.returncode == 1
        assert "removed 1.0.0" in proc.stdout.splitlines()
        line = one_line(proc)
        assert f"did not remove image sha256:{_id(1)} of 1.0.0" in line
        assert "image used by a container" in line and "next `agent-fsm release prune`" in line
        assert _id(1) in store.ids() and origins.read(node.node, "1.0.0") != ()
        store.change("busy", [])
        again = prune(node.node)
        assert again.removed == () and [v for v, _ in again.images.removed] == ["1.0.0"]
        assert store.ids() == {_id(2), _id(3)} and origins.read(node.node, "1.0.0") == ()

    def test_named_prune_keeps_the_others_and_their_images(self, node: World, store: Store,
                                                           tmp_path: Path) -> None:
        """Naming one release removes it and its image only; every other release and image is
        kept (a release neither named nor protected used to stop the prune midway)."""
        self._three(node, store, tmp_path)
        node.add_release("0.9.0")
        done = prune(node.node, ("3.0.0",))
        assert done.removed == ("3.0.0",)
        assert dict(done.kept)["0.9.0"] == ("not named",)
        assert node.node.releases.versions() == ["0.9.0", "1.0.0", "2.0.0"]
        assert store.ids() == {_id(1), _id(2)}

    def test_damaged_record_refuses_prune_before_anything_is_removed(
            self, node: World, store: Store, tmp_path: Path) -> None:
        """A damaged image record refuses the prune (naming the file) with no release and no
        image removed."""
        self._three(node, store, tmp_path)
        record = node.paths.releases_dir / origins.RECORDS / "1.0.0"
        record.write_text(record.read_text().replace('"added":true', '"added":"yes"'))
        with pytest.raises(ReleaseError, match=f"image record {record} is damaged"):
            prune(node.node)
        assert node.node.releases.versions() == ["1.0.0", "2.0.0", "3.0.0"]
        assert store.ids() == {_id(1), _id(2), _id(3)}

    def test_image_gone_from_the_store_counts_as_removed(self, node: World, store: Store,
                                                         tmp_path: Path) -> None:
        """An added image someone already removed by hand is counted removed, its record goes,
        and podman is not asked to remove it."""
        self._three(node, store, tmp_path)
        data = store.load()
        del data["images"][_id(1)]
        store.save(data)
        done = prune(node.node)
        assert [v for v, _ in done.images.removed] == ["1.0.0"] and not done.images.failed
        assert "rmi" not in store.verbs() and origins.read(node.node, "1.0.0") == ()

    def test_no_podman_needed_without_images_to_remove(self, node: World, store: Store) -> None:
        """A node without release images prunes with no podman at all."""
        node.installed("2.0.0")
        node.add_release("1.0.0")
        gone = node.node.config._replace(podman=("/nonexistent/podman",))
        assert prune(make_world(node.root, gone).node).removed == ("1.0.0",)
        assert store.verbs() == []
