"""The agent_fsm.fleet modules against a fake node agent-fsm (faked at run_command, the process boundary)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ansible", reason="the collection's modules need ansible-core (the test extras)")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ansible"))

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args
from ansible_collections.agent_fsm.fleet.plugins.modules import info, release, upgrade

from tests.actions import hostile_tars as h
from tests.node.test_release_store import CONFIG, make_release

Answer = tuple[int, str, str]


def _status(state: str = "converged", selected: str | None = "1.0.0", **more: Any) -> dict[str, Any]:
    return {"state": state, "selected": selected, "last_good": selected, "gate": "open",
            "signal": None, "owed": None, "candidate": None, "releases": [], **more}


class FakeAgentFsm:
    """Answers the module's agent-fsm commands from a script; records every argv."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.answers: dict[str, list[Answer]] = {}

    def on(self, command: str, *answers: Answer) -> None:
        """Answer `command` (e.g. "status", "upgrade") with these, in turn; the last repeats."""
        self.answers[command] = list(answers)

    def __call__(self, _module: Any, argv: list[str], **_kwargs: Any) -> Answer:
        self.calls.append(list(argv))
        command = " ".join(a for a in argv[3:5] if not a.startswith("-")) if argv[3] == "release" else argv[3]
        queue = self.answers.get(command)
        if not queue:
            raise AssertionError(f"unexpected agent-fsm call: {argv}")
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def commands(self) -> list[str]:
        return [argv[3] for argv in self.calls]


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """A node's config naming a state_dir whose selected release has a bin/agent-fsm."""
    state = tmp_path / "state"
    binary = state / "selected" / "bin" / "agent-fsm"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 99\n")  # never run: run_command is faked
    binary.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(f'name = "agent"\nstate_dir = "{state}"\n')
    return {"config": config, "state": state, "binary": binary}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAgentFsm]:
    agent = FakeAgentFsm()
    monkeypatch.setattr(basic.AnsibleModule, "run_command",
                        lambda module, argv, **kwargs: agent(module, argv, **kwargs))
    monkeypatch.setattr("time.sleep", lambda _s: None)
    yield agent


def _run(main: Callable[[], None], capsys: pytest.CaptureFixture[str], **args: Any) -> dict[str, Any]:
    """Run a module's main() with `args` (`_ansible_check_mode` etc. included); its JSON result."""
    with patch_module_args(args), pytest.raises(SystemExit):
        main()
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _json(value: Any) -> Answer:
    return (0, json.dumps(value), "")


class TestUpgrade:
    def test_converged_node_is_upgraded_and_followed(self, node: dict[str, Path], fake: FakeAgentFsm,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
        """A node converged on 1.0.0 is upgraded with `upgrade --to 2.0.0 --wait` and the result
        carries its status after."""
        fake.on("status", _json(_status()), _json(_status(selected="2.0.0")))
        fake.on("upgrade", (0, "converged on 2.0.0\n", ""))
        result = _run(upgrade.main, capsys, version="2.0.0", config=str(node["config"]), timeout=90)
        assert result["changed"] is True and not result.get("failed")
        assert (result["action"], result["previous"]) == ("upgrade", "1.0.0")
        assert result["status"]["selected"] == "2.0.0"
        assert [str(node["binary"]), "--config", str(node["config"]), "upgrade", "--to", "2.0.0",
                "--wait", "--timeout", "90"] in fake.calls

    def test_already_there_is_unchanged(self, node: dict[str, Path], fake: FakeAgentFsm,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """A node converged on the version is left alone: unchanged, nothing but status run."""
        fake.on("status", _json(_status(selected="2.0.0")))
        result = _run(upgrade.main, capsys, version="2.0.0", config=str(node["config"]))
        assert (result["changed"], result["action"]) == (False, "none")
        assert fake.commands() == ["status"]

    def test_rolled_back_fails_with_rolled_back(self, node: dict[str, Path], fake: FakeAgentFsm,
                                                capsys: pytest.CaptureFixture[str]) -> None:
        """Exit 4 (judged failed, rolled back) fails the task with rolled_back true."""
        fake.on("status", _json(_status()))
        fake.on("upgrade", (4, "", "agent-fsm: 2.0.0 was judged failed: rolled back to 1.0.0\n"))
        result = _run(upgrade.main, capsys, version="2.0.0", config=str(node["config"]))
        assert (result["failed"], result["rolled_back"], result["refused"]) == (True, True, False)
        assert "rolled back to 1.0.0" in result["msg"]

    def test_refused_fails_with_refused(self, node: dict[str, Path], fake: FakeAgentFsm,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        """Exit 3 (refused: an upgrade is pending) fails the task with refused true."""
        fake.on("status", _json(_status(state="candidate_running")))
        fake.on("upgrade", (3, "", "agent-fsm: refused: an upgrade to 1.5.0 is being judged\n"))
        result = _run(upgrade.main, capsys, version="2.0.0", config=str(node["config"]))
        assert (result["failed"], result["rolled_back"], result["refused"]) == (True, False, True)

    def test_check_mode_runs_nothing_and_diffs(self, node: dict[str, Path], fake: FakeAgentFsm,
                                               capsys: pytest.CaptureFixture[str]) -> None:
        """Check mode reads the status only, says it would upgrade, and diffs the versions."""
        fake.on("status", _json(_status()))
        result = _run(upgrade.main, capsys, version="2.0.0", config=str(node["config"]),
                      _ansible_check_mode=True, _ansible_diff=True)
        assert fake.commands() == ["status"]
        assert result["changed"] is True and "would upgrade" in result["msg"]
        assert result["diff"] == {"before": "version: 1.0.0\nstate: converged\n",
                                  "after": "version: 2.0.0\nstate: converged\n"}

    def test_idle_node_is_installed_with_the_stored_release(self, node: dict[str, Path], fake: FakeAgentFsm,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
        """An idle node (nothing selected) is installed by the stored release's own agent-fsm,
        and followed until it rests."""
        node["binary"].unlink()
        stored = node["state"] / "releases" / "1.0.0" / "bin" / "agent-fsm"
        stored.parent.mkdir(parents=True)
        stored.write_text("#!/bin/sh\n")
        stored.chmod(0o755)
        idle = _status(state="idle", selected=None)
        fake.on("status", _json(idle), _json(_status(gate="closed")), _json(_status()))
        fake.on("install", (0, "installed 1.0.0\n", ""))
        result = _run(upgrade.main, capsys, version="1.0.0", config=str(node["config"]))
        assert result["changed"] is True and not result.get("failed"), result
        assert fake.calls[1][:1] == [str(stored)] and fake.calls[1][3:] == ["install", "--version", "1.0.0"]
        assert fake.commands() == ["status", "install", "status", "status", "status"]


def _release(directory: Path, version: str) -> Path:
    (directory / "bin").mkdir(parents=True)
    (directory / "release.toml").write_text(f'version = "{version}"\n')
    launcher = directory / "bin" / "agent-fsm"
    launcher.write_text("#!/bin/sh\n")
    launcher.chmod(0o755)
    return directory


class TestRelease:
    @pytest.mark.parametrize(("said", "changed"), [("stored at", True), ("already stored at", False)])
    def test_changed_only_when_stored_anew(self, node: dict[str, Path], fake: FakeAgentFsm,
                                           tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           said: str, changed: bool) -> None:
        """`release add` answering "stored" is a change; "already stored" is not."""
        src = _release(tmp_path / "rel", "2.0.0")
        fake.on("release add", (0, f"release 2.0.0 {said} /x (sha256:ab)\n", ""))
        result = _run(release.main, capsys, src=str(src), remote_src=True, config=str(node["config"]))
        assert (result["changed"], result["version"]) == (changed, "2.0.0")
        assert fake.calls[0][3:] == ["release", "add", str(src)]

    def test_other_content_is_refused(self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
        """The same version stored with other content (exit 3) fails with refused true."""
        src = _release(tmp_path / "rel", "2.0.0")
        fake.on("release add", (3, "", "agent-fsm: release 2.0.0 is stored with other content\n"))
        result = _run(release.main, capsys, src=str(src), remote_src=True, config=str(node["config"]))
        assert (result["failed"], result["refused"]) == (True, True)

    def test_archive_is_handed_to_agent_fsm_as_it_is(
            self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        """On a node with an agent-fsm, an archive is given to `release add` unread, and the
        version returned is the one its answer names."""
        archive = tmp_path / "r.tar.gz"
        archive.write_bytes(b"not even read by the module")
        said = f"release 2.0.0 stored at {node['state']}/releases/2.0.0 (sha256:ab)\n"
        fake.on("release add", (0, said, ""))
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]))
        assert (result["changed"], result["version"]) == (True, "2.0.0"), result
        assert result["path"] == str(node["state"] / "releases" / "2.0.0")
        assert fake.calls == [[str(node["binary"]), "--config", str(node["config"]), "release", "add",
                               str(archive)]]

    def test_archive_in_check_mode_is_not_read(self, node: dict[str, Path], fake: FakeAgentFsm,
                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """In check mode an archive would be stored, with no version, and nothing is run."""
        archive = tmp_path / "r.tar"
        archive.write_bytes(b"")
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]),
                      _ansible_check_mode=True)
        assert (result["changed"], "version" in result) == (True, False), result
        assert result["msg"] == (f"release archive {archive} would be stored (an archive is not read "
                                 "in check mode)")
        assert fake.calls == []

    def test_archive_on_an_idle_node_is_refused_unread(
            self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        """On a node with no agent-fsm, a user's archive (even a good one) fails in one line
        saying to give `binary` or a directory, and nothing is unpacked or run."""
        node["binary"].unlink()
        src = _release(tmp_path / "agent-fsm-2.0.0", "2.0.0")
        archive = tmp_path / "r\x1b[2J.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(src, arcname="agent-fsm-2.0.0")
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]))
        assert result["failed"] is True and "\n" not in result["msg"] and "\x1b" not in result["msg"]
        assert result["msg"].startswith(f"release archive {str(archive)!r} is not read: this node has no "
                                        "agent-fsm to read it with"), result
        assert "give `binary`, or the release as a directory" in result["msg"]
        assert fake.calls == []

    def test_directory_packed_by_the_action_bootstraps_an_idle_node(
            self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        """On an idle node, the action plugin's tar of a release directory is unpacked and stored
        by the release's own agent-fsm."""
        node["binary"].unlink()
        src = _release(tmp_path / "agent-fsm-2.0.0", "2.0.0")
        archive = tmp_path / "release.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(src, arcname="release")
        fake.on("release add", (0, "release 2.0.0 stored at /x\n", ""))
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]),
                      _packed=True)
        assert (result["changed"], result["version"]) == (True, "2.0.0"), result
        added = Path(fake.calls[0][-1])
        assert added.name == "release" and added != src
        assert fake.calls[0][0] == str(added / "bin" / "agent-fsm")

    def test_packed_member_escaping_its_directory_is_refused(
            self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        """A member of a packed tar that would land outside the extraction directory fails the
        task before anything runs."""
        node["binary"].unlink()
        archive = tmp_path / "evil.tar"
        with tarfile.open(archive, "w") as tar:
            data = b"x"
            member = tarfile.TarInfo("../escaped")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]),
                      _packed=True)
        # The module's own check: the node's Python may predate tarfile's extraction filters.
        assert result["failed"] is True
        assert "'../escaped' is not a plain file or directory inside the archive" in result["msg"]
        assert fake.calls == []

    def test_packed_directory_with_a_link_is_refused(
            self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        """A release directory holding a symlink (a release holds files and directories only),
        packed by the action plugin, fails the task before anything is extracted or run."""
        node["binary"].unlink()
        archive = tmp_path / "link.tar"
        with tarfile.open(archive, "w") as tar:
            member = tarfile.TarInfo("release/bin/agent-fsm")
            member.type, member.linkname = tarfile.SYMTYPE, "/bin/sh"
            tar.addfile(member)
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]),
                      _packed=True)
        assert result["failed"] is True and "not a plain file or directory" in result["msg"]
        assert fake.calls == []


class TestInfo:
    def test_status_and_history(self, node: dict[str, Path], fake: FakeAgentFsm,
                                capsys: pytest.CaptureFixture[str]) -> None:
        """info returns status --json and the last transitions, unchanged, in check mode too."""
        fake.on("status", _json(_status()))
        fake.on("history", _json([{"trigger": "complete"}]))
        result = _run(info.main, capsys, config=str(node["config"]), history=3, _ansible_check_mode=True)
        assert (result["changed"], result["installed"]) == (False, True)
        assert result["state_dir"] == str(node["state"])
        assert result["history"] == [{"trigger": "complete"}]
        assert fake.calls[1][3:] == ["history", "--limit", "3", "--json"]

    def test_idle_node_read_with_a_given_binary(self, node: dict[str, Path], fake: FakeAgentFsm,
                                                capsys: pytest.CaptureFixture[str]) -> None:
        """With `binary` given, an idle node's status is read and it says installed false."""
        fake.on("status", _json(_status(state="idle", selected=None)))
        fake.on("history", _json([]))
        result = _run(info.main, capsys, config=str(node["config"]), binary="/opt/agent-fsm")
        assert (result["installed"], result["status"]["state"]) == (False, "idle")
        assert fake.calls[0][0] == "/opt/agent-fsm"

    def test_nothing_installed(self, node: dict[str, Path], fake: FakeAgentFsm,
                               capsys: pytest.CaptureFixture[str]) -> None:
        """A node with no selected release answers installed false and runs nothing."""
        node["binary"].unlink()
        result = _run(info.main, capsys, config=str(node["config"]))
        assert (result["installed"], result["binary"]) == (False, None)
        assert "status" not in result and fake.calls == []

    def test_missing_config_fails_with_its_path(self, tmp_path: Path, fake: FakeAgentFsm,
                                                capsys: pytest.CaptureFixture[str]) -> None:
        """A config file named but absent fails with the path in the message."""
        result = _run(info.main, capsys, config=str(tmp_path / "nope.toml"))
        assert result["failed"] is True and str(tmp_path / "nope.toml") in result["msg"]


ROOT = Path(__file__).resolve().parents[2]
RSS_BOUND = 150 << 20  # the module and the agent-fsm it runs; tarfile spent 200 MB to GBs on these
# Runs the module with its stdout to a file, then prints the peak RSS (KiB) of it and its
# children: measured from a small process, since a child's count starts from its parent's.
_PEAK = ("import resource, subprocess, sys\n"
         "with open(sys.argv[1], 'wb') as out:\n"
         "    subprocess.run(sys.argv[2:], stdout=out, timeout=120, check=False)\n"
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
BOMBS: dict[str, Callable[[Path], Path]] = {
    "pax header of 128 MiB": lambda d: h.pax_bomb(d / "bomb.tar.gz"),
    "GNU long name of 512 MiB": lambda d: h.longname_bomb(d / "bomb.tar.xz"),
    "500,000 ./ headers": lambda d: h.dot_members(d / "dots.tar.xz", 500_000),
    "5,000 chained pax headers": lambda d: h.pax_chain(d / "chain.tar.gz", 5000),
}


def run_module(tmp_path: Path, **args: Any) -> tuple[dict[str, Any], int]:
    """The release module run as Ansible runs it on a node, in a process of its own with its
    arguments in a file: its JSON result, and the peak RSS (bytes) of it and what it ran."""
    args_file, out = tmp_path / "args.json", tmp_path / "module.out"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        "_ansible_remote_tmp": str(tmp_path / "remote-tmp"), "remote_src": True, **args}}))
    env = {k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"}
    env["PYTHONPATH"] = str(ROOT / "ansible")
    done = subprocess.run([sys.executable, "-c", _PEAK, str(out), sys.executable, release.__file__,
                           str(args_file)], env=env, capture_output=True, timeout=150, check=True)
    answer = out.read_text().strip()
    assert answer.startswith("{"), f"the module printed no result: {done.stderr[-2000:]!r}"
    return json.loads(answer), int(done.stdout) * 1024


def agent_fsm_node(tmp_path: Path) -> dict[str, Any]:
    """A node below tmp_path/root whose agent-fsm (the `binary` option) is this checkout's."""
    binary = tmp_path / "agent-fsm"
    binary.write_text(f'#!/bin/sh\nexec {sys.executable} -m agent_fsm --root {tmp_path / "root"} "$@"\n')
    binary.chmod(0o755)
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    return {"binary": str(binary), "config": str(config)}


def in_store(tmp_path: Path) -> list[str]:
    """Everything in the node's releases directory, its records included."""
    releases = tmp_path / "root" / "var" / "lib" / "agent-fsm" / "releases"
    return sorted(p.name for p in releases.iterdir()) if releases.exists() else []


class TestArchivesOnTheNode:
    def test_a_good_archive_is_stored_by_the_nodes_agent_fsm(self, tmp_path: Path) -> None:
        """A release archive given to a node with an agent-fsm is stored by it, and the module
        returns the version agent-fsm's answer names."""
        archive = tmp_path / "agent-fsm-1.0.0.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(make_release(tmp_path), arcname="agent-fsm-1.0.0")
        result, _rss = run_module(tmp_path, src=str(archive), **agent_fsm_node(tmp_path))
        assert (result.get("failed"), result["changed"], result["version"]) == (None, True, "1.0.0"), result
        assert result["msg"].startswith("release 1.0.0 stored at "), result
        assert "1.0.0" in in_store(tmp_path)

    @pytest.mark.parametrize("bomb", list(BOMBS))
    def test_a_hostile_archive_is_refused_by_the_nodes_agent_fsm_within_bounds(
            self, tmp_path: Path, bomb: str) -> None:
        """A hostile archive (a huge extended header, a flood of members, a chain of pax
        headers) given to a node with an agent-fsm fails the task in one line from agent-fsm,
        stores nothing, and the module and what it runs stay under 150 MB."""
        archive = BOMBS[bomb](tmp_path)
        result, rss = run_module(tmp_path, src=str(archive), **agent_fsm_node(tmp_path))
        assert rss < RSS_BOUND, f"peak RSS {rss >> 20} MiB"
        assert (result.get("failed"), result["refused"]) == (True, False), result
        msg = result["msg"]
        assert msg.startswith(f"agent-fsm release add failed (exit 1): agent-fsm: refusing release "
                              f"archive {archive}: "), msg
        assert "\n" not in msg and len(msg) < 1000 and msg.endswith("nothing was stored"), msg
        assert in_store(tmp_path) == []

    @pytest.mark.parametrize("bomb", list(BOMBS))
    def test_a_hostile_archive_on_an_idle_node_is_refused_unread(self, tmp_path: Path, bomb: str) -> None:
        """On a node with no agent-fsm, a hostile archive fails the task in one line saying to
        give `binary` or a directory, before the module reads it (under 150 MB)."""
        archive = BOMBS[bomb](tmp_path)
        config = tmp_path / "config.toml"
        config.write_text(f'name = "agent"\nstate_dir = "{tmp_path / "state"}"\n')
        result, rss = run_module(tmp_path, src=str(archive), config=str(config))
        assert rss < RSS_BOUND, f"peak RSS {rss >> 20} MiB"
        assert result.get("failed") is True, result
        assert result["msg"] == (
            f"release archive {archive} is not read: this node has no agent-fsm to read it with (no "
            f"`binary` given, none selected under {tmp_path / 'state'}); give `binary`, or the release as "
            "a directory (a directory on the controller is copied as one)"), result
        assert not (tmp_path / "state").exists()
