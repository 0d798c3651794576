"""The Debian 13 node's root file system builder: its mirror, and one atomic build however many
test workers ask at once (debootstrap and chroot, the process boundary, are faked here; the
e2e suite builds and boots the real tree)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agent_fsm_lab import rootfs


def _apt(tmp_path: Path, sources: str = "", sources_list: str = "") -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    if sources:
        (apt / "sources.list.d" / "debian.sources").write_text(sources)
    if sources_list:
        (apt / "sources.list").write_text(sources_list)
    return apt


class TestMirror:
    def test_first_debian_source_that_is_not_a_security_one(self, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
        """The mirror is the `URIs:` of the first deb stanza that is not the security archive,
        whatever the order of the stanzas."""
        monkeypatch.delenv("AGENT_FSM_TEST_MIRROR", raising=False)
        apt = _apt(tmp_path, sources=(
            "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n"
            "\n"
            "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n"
            "\n"
            "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm\n"))
        assert rootfs.mirror(apt) == "http://mirror.example/debian"

    def test_one_line_sources_list(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without deb822 sources, `deb [options] URI suite` lines of sources.list name it."""
        monkeypatch.delenv("AGENT_FSM_TEST_MIRROR", raising=False)
        apt = _apt(tmp_path, sources_list=(
            "# deb http://old.example/debian bookworm main\n"
            "deb [signed-by=/usr/share/keyrings/k.gpg] http://list.example/debian bookworm main\n"))
        assert rootfs.mirror(apt) == "http://list.example/debian"

    def test_none_says_where_it_looked_and_what_to_do(self, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
        """No source at all: the error names the files read and the variable that overrides."""
        monkeypatch.delenv("AGENT_FSM_TEST_MIRROR", raising=False)
        with pytest.raises(rootfs.RootfsError, match="AGENT_FSM_TEST_MIRROR") as err:
            rootfs.mirror(_apt(tmp_path))
        assert str(tmp_path / "apt" / "sources.list") in str(err.value)


class FakeDebootstrap:
    """Stands in for the debootstrap and chroot processes: makes a tiny tree, counts builds."""

    def __init__(self, fail: bool = False) -> None:
        self.builds: list[str] = []
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, argv: list[str], timeout: float, what: str,
                 inherit_env: bool = False) -> str:
        if "debootstrap" in argv:
            target = Path(argv[-2])
            with self.lock:
                self.builds.append(target.name)
            (target / "etc").mkdir(parents=True)
            (target / "etc" / "os-release").write_text("VERSION_CODENAME=trixie\n")
            if self.fail:
                raise rootfs.RootfsError("debootstrap failed (fake)")
            return ""
        if "--version" in argv:
            return "systemd 257 (257.13-1~deb13u1)\n"
        return "3.13.5\n"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDebootstrap:
    fake = FakeDebootstrap()
    monkeypatch.setattr(rootfs, "_run", fake)
    monkeypatch.setattr(rootfs, "missing_requirements", lambda cache: [])
    monkeypatch.setenv("AGENT_FSM_TEST_MIRROR", "http://mirror.example/debian")
    return fake


class TestBuild:
    def test_parallel_workers_build_the_tree_once(self, tmp_path: Path,
                                                  fake: FakeDebootstrap) -> None:
        """Six workers asking for the node at once get the same tree, built by one debootstrap,
        renamed into place whole (no hidden half-built sibling left)."""
        got: list[rootfs.Node] = []

        def worker() -> None:
            got.append(rootfs.ensure_rootfs(tmp_path))

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(fake.builds) == 1
        assert len(got) == 6 and {n.rootfs for n in got} == {rootfs.rootfs_dir(tmp_path)}
        assert got[0].systemd.startswith("systemd 257") and got[0].python == "3.13.5"
        assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [got[0].rootfs.name]

    def test_a_failed_build_leaves_no_tree(self, tmp_path: Path, fake: FakeDebootstrap) -> None:
        """A debootstrap that fails leaves neither the tree nor its half-built sibling, and the
        next call builds again."""
        fake.fail = True
        with pytest.raises(rootfs.RootfsError, match="fake"):
            rootfs.ensure_rootfs(tmp_path)
        assert [p for p in tmp_path.iterdir() if p.is_dir()] == []
        fake.fail = False
        assert (rootfs.ensure_rootfs(tmp_path).rootfs / "etc" / "os-release").is_file()
        assert len(fake.builds) == 2

    def test_a_changed_recipe_builds_a_new_tree(self, tmp_path: Path, fake: FakeDebootstrap,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        """The tree is named by its recipe: the same recipe is built once, another one (one more
        package) is built anew beside it."""
        first = rootfs.ensure_rootfs(tmp_path).rootfs
        assert rootfs.ensure_rootfs(tmp_path).rootfs == first
        monkeypatch.setitem(rootfs.RECIPE, "include", [*rootfs.PACKAGES, "strace"])
        second = rootfs.ensure_rootfs(tmp_path).rootfs
        assert second != first and len(fake.builds) == 2

    def test_a_tree_without_its_stamp_is_built_again(self, tmp_path: Path,
                                                     fake: FakeDebootstrap) -> None:
        """A tree whose stamp is missing (a build killed before it was finished) is rebuilt."""
        tree = rootfs.ensure_rootfs(tmp_path).rootfs
        (tree / rootfs.STAMP).unlink()
        assert (rootfs.ensure_rootfs(tmp_path).rootfs / rootfs.STAMP).is_file()
        assert len(fake.builds) == 2


class TestCommand:
    def test_if_possible_names_what_is_missing_and_succeeds(
            self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        """`python -m agent_fsm_lab.rootfs --if-possible` on a machine without debootstrap says
        so and exits 0 (so `make test` goes on, and the 257 tests skip or fail there)."""
        monkeypatch.setattr(rootfs, "missing_requirements",
                            lambda cache=rootfs.CACHE_DIR: ["the `debootstrap` program"])
        monkeypatch.setattr(rootfs, "ensure_rootfs", lambda cache=rootfs.CACHE_DIR: 1 / 0)
        assert rootfs.main(["--if-possible"]) == 0
        assert "missing: the `debootstrap` program" in capsys.readouterr().out

    def test_a_build_that_fails_is_exit_1_in_one_line(
            self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        """A build that fails exits 1 with the reason on stderr, no traceback."""
        def fail(cache: Path = rootfs.CACHE_DIR) -> rootfs.Node:
            raise rootfs.RootfsError("debootstrap exited 1")

        monkeypatch.setattr(rootfs, "ensure_rootfs", fail)
        assert rootfs.main([]) == 1
        assert capsys.readouterr().err == "agent_fsm_lab.rootfs: debootstrap exited 1\n"
