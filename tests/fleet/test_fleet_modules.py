"""The agent_fsm.fleet modules against a fake node agent-fsm (faked at run_command, the process boundary)."""

from __future__ import annotations

import io
import json
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

    def test_archive_is_extracted_and_added(self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
        """A tar archive holding a release in one top directory is extracted and that directory added."""
        src = _release(tmp_path / "agent-fsm-2.0.0", "2.0.0")
        archive = tmp_path / "r.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(src, arcname="agent-fsm-2.0.0")
        fake.on("release add", (0, "release 2.0.0 stored at /x\n", ""))
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]))
        assert result["changed"] is True, result
        added = Path(fake.calls[0][-1])
        assert added.name == "agent-fsm-2.0.0" and added != src

    def test_archive_escaping_its_directory_is_refused(
            self, node: dict[str, Path], fake: FakeAgentFsm, tmp_path: Path,
            capsys: pytest.CaptureFixture[str]) -> None:
        """An archive member that would land outside the extraction directory fails the task
        before anything runs."""
        archive = tmp_path / "evil.tar"
        with tarfile.open(archive, "w") as tar:
            data = b"x"
            member = tarfile.TarInfo("../escaped")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]))
        # The module's own check: the node's Python may predate tarfile's extraction filters.
        assert result["failed"] is True
        assert "'../escaped' is not a plain file or directory inside the archive" in result["msg"]
        assert fake.calls == []


    def test_archive_with_a_link_is_refused(self, node: dict[str, Path], fake: FakeAgentFsm,
                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An archive holding a symlink (a release holds files and directories only) fails the
        task before anything is extracted or run."""
        archive = tmp_path / "link.tar"
        with tarfile.open(archive, "w") as tar:
            member = tarfile.TarInfo("release/bin/agent-fsm")
            member.type, member.linkname = tarfile.SYMTYPE, "/bin/sh"
            tar.addfile(member)
        result = _run(release.main, capsys, src=str(archive), remote_src=True, config=str(node["config"]))
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
