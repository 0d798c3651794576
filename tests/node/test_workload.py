"""The workload's node side: its command's placeholders, the `[workload]` table, the agent unit's
lines for it, and the record `status` reads (`<run_dir>/workload.json`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from agent_fsm.actions.releases import packing
from agent_fsm.errors import ConfigError, ReleaseError
from agent_fsm.node import config as config_mod
from agent_fsm.node.assets import render
from agent_fsm.node.config import Config, WorkloadConfig
from agent_fsm.node.paths import Paths
from agent_fsm.node.releases import workload as command
from agent_fsm.node.releases.pointers import read_manifest
from agent_fsm.node.runtime import workload as record
from tests.cli.test_cli import run
from tests.helpers import make_world

SOURCE = Path("/etc/agent-fsm/config.toml")
DIRS = {"release_dir": "/r/1.0", "payload_dir": "/r/1.0/payload", "version": "1.0"}


class TestPlaceholders:
    def test_placeholders_expand_inside_any_word(self) -> None:
        """{release_dir}, {payload_dir} and {version} are replaced wherever they are in a word."""
        argv = ("{payload_dir}/myagent", "--data={release_dir}/data", "v{version}", "plain")
        assert command.expand(argv, **DIRS) == (
            "/r/1.0/payload/myagent", "--data=/r/1.0/data", "v1.0", "plain")

    def test_doubled_braces_are_literal(self) -> None:
        """`{{` and `}}` are one brace each, never a placeholder: a shell's `${x}` is `${{x}}`."""
        assert command.expand(("echo ${{HOME}} {{version}}",), **DIRS) == (
            "echo ${HOME} {version}",)

    @pytest.mark.parametrize("word", ["{name}", "{}", "a { b", "x}", "{version!r}",
                                      "{version:>9}"])
    def test_unknown_placeholder_or_lone_brace_is_refused(self, word: str) -> None:
        """Anything else in braces, or a lone brace, is refused in one line naming the word."""
        with pytest.raises(ReleaseError) as err:
            command.check(("/bin/agent", word), "release pack --workload")
        text = str(err.value)
        assert "\n" not in text and repr(word) in text and "{release_dir}" in text

    def test_release_add_refuses_an_unknown_placeholder(self, tmp_path: Path) -> None:
        """A manifest naming an unknown placeholder is refused where it is read (`release add`
        reads it before storing anything)."""
        manifest = tmp_path / "release.toml"
        manifest.write_text('version = "1.0"\nworkload = ["/bin/agent", "--home={home}"]\n')
        with pytest.raises(ReleaseError, match=r"unknown placeholder \{home\}"):
            read_manifest(manifest)

    def test_release_add_says_so_in_one_line(self, tmp_path: Path) -> None:
        """`release add` of such a release exits 1 with one line naming the placeholder, the
        directory as the operator gave it, and how to write a literal brace; nothing stored."""
        release = tmp_path / "rel"
        (release / "bin").mkdir(parents=True)
        (release / "release.toml").write_text('version = "1.0"\nworkload = ["{home}/agent"]\n')
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'name = "agent"\nstate_dir = "{tmp_path / "state"}"\n')
        proc = run("--config", str(cfg), "release", "add", str(release))
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1 and str(release) in proc.stderr
        assert "unknown placeholder {home}" in proc.stderr and "{{ or }}" in proc.stderr
        assert not (tmp_path / "state" / "releases" / "1.0").exists()

    def test_release_pack_refuses_an_unknown_placeholder_before_writing(self,
                                                                       tmp_path: Path) -> None:
        """`release pack` refuses it too, and writes nothing."""
        with pytest.raises(ReleaseError, match="release pack --workload"):
            packing.pack("1.0", tmp_path / "out", ("/bin/agent", "{relase_dir}"))
        assert not (tmp_path / "out").exists()


class TestConfig:
    def test_every_key_is_read(self) -> None:
        """[workload] user, group, environment, writable_paths and identifier are read, and kept
        settings (`to_table`) read back the same."""
        cfg = config_mod.parse({"workload": {
            "user": "nobody", "group": 65534, "environment": {"MODE": "prod"},
            "writable_paths": ["/var/lib/myagent"], "identifier": "myagent"}}, SOURCE)
        assert cfg.workload == WorkloadConfig("nobody", 65534, (("MODE", "prod"),),
                                              (Path("/var/lib/myagent"),), "myagent")
        assert config_mod.parse(config_mod.to_table(cfg), SOURCE).workload == cfg.workload

    def test_unknown_key_is_refused_and_ignored_on_the_way_back(
            self, caplog: pytest.LogCaptureFixture) -> None:
        """An unknown key in [workload] is refused naming the known ones; `daemon` and `recover`
        (lenient) log it and go on."""
        data = {"workload": {"usr": "nobody"}}
        with pytest.raises(ConfigError, match=r"`workload.usr`.*known keys here: environment"):
            config_mod.parse(data, SOURCE)
        assert config_mod.parse(data, SOURCE, lenient=True).workload == WorkloadConfig()
        assert "ignoring unknown key `workload.usr`" in caplog.text

    @pytest.mark.parametrize(("table", "key"), [
        ({"user": "no body"}, "workload.user"),
        ({"user": -1}, "workload.user"),
        ({"group": True}, "workload.group"),
        ({"environment": {"1X": "a"}}, "workload.environment.1X"),
        ({"environment": {"NOTIFY_SOCKET": "/run/x"}}, "workload.environment.NOTIFY_SOCKET"),
        ({"environment": {"A": 1}}, "workload.environment.A"),
        ({"writable_paths": ["relative/dir"]}, "workload.writable_paths[0]"),
        ({"writable_paths": "/var/lib/x"}, "workload.writable_paths"),
        ({"identifier": "my agent"}, "workload.identifier"),
    ])
    def test_bad_values_are_refused_naming_the_key(self, table: dict[str, object],
                                                   key: str) -> None:
        """A bad value is refused in one line that names its key."""
        with pytest.raises(ConfigError, match=re.escape(f"`{key}`")):
            config_mod.parse({"workload": table}, SOURCE)


class TestUnitLines:
    def test_writable_paths_and_the_releases_view_are_rendered_into_the_agent_unit(
            self, tmp_path: Path) -> None:
        """The agent unit grants the writable paths (missing ones skipped, "-") and binds the
        releases read-only below the run dir, where the marker of the template was."""
        config = Config(name="agent", workload=WorkloadConfig(
            writable_paths=(Path("/var/lib/myagent"), Path("/srv/cache"))))
        world = make_world(tmp_path / "root", config)
        world.add_release("1.0.0")
        unit = world.rendered("1.0.0")["agent.service"].decode()
        assert "ReadWritePaths=-/var/lib/myagent -/srv/cache\n" in unit
        assert "BindReadOnlyPaths=-/var/lib/agent-fsm/releases:/run/agent-fsm/releases\n" in unit
        assert render.WORKLOAD_MARKER not in unit

    def test_a_template_without_the_marker_renders_as_before(self, tmp_path: Path) -> None:
        """An older release's template (no marker) renders unchanged whatever [workload] says:
        a unit setting is never forced into a template that did not ask for it."""
        config = Config(name="agent", workload=WorkloadConfig(writable_paths=(Path("/srv"),)))
        world = make_world(tmp_path / "root", config)
        old = "[Service]\nExecStart=${selected}/bin/agent-fsm daemon\n"
        world.add_release("0.9.0", agent_unit=old)
        assert world.rendered("0.9.0")["agent.service"].decode() == (
            "[Service]\nExecStart=/var/lib/agent-fsm/selected/bin/agent-fsm daemon\n")


def _record(tmp_path: Path, **fields: object) -> Paths:
    paths = Paths(Config(name="agent", state_dir=tmp_path / "state",
                         run_dir=Path("/run/agent")), tmp_path / "root")
    release = paths.releases_dir / "1.0"
    release.mkdir(parents=True)
    (release / "release.toml").write_text('version = "1.0"\nworkload = ["/bin/agent"]\n')
    paths.selected.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(release, paths.selected)
    if fields:
        base = record.Record("1.0", ("/bin/agent",), "nobody", True, os.getpid(),
                             "2026-01-01T00:00:00Z", 2, None, os.getpid())
        record.write(paths, base._replace(**fields))
    return paths


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


class TestRecord:
    def test_a_running_workload_is_shown_with_its_pid(self, tmp_path: Path) -> None:
        """While its process and its daemon live, the record is shown as running, with its pid."""
        paths = _record(tmp_path, pid=os.getpid())
        view = record.view(paths, "1.0", "root")
        assert view is not None
        assert (view["running"], view["pid"], view["user"], view["restarts"]) == (
            True, os.getpid(), "nobody", 2)
        assert set(view) == {"command", "running", "pid", "since", "restarts", "last_exit",
                             "user", "writable_paths"}

    @pytest.mark.parametrize("dead", ["pid", "daemon_pid"])
    def test_a_stale_record_is_not_running(self, tmp_path: Path, dead: str) -> None:
        """A record whose workload or daemon is gone (killed with SIGKILL) reads as not
        running, without a pid."""
        paths = _record(tmp_path, **{dead: _dead_pid()})
        view = record.view(paths, "1.0", "root")
        assert view is not None and (view["running"], view["pid"]) == (False, None)

    def test_no_record_is_not_running_and_no_workload_is_null(self, tmp_path: Path) -> None:
        """Without a record the declared workload is not running; a release declaring none
        shows null."""
        paths = _record(tmp_path)
        view = record.view(paths, "1.0", "nobody")
        assert view is not None and (view["running"], view["command"], view["user"]) == (
            False, ["/bin/agent"], "nobody")
        (paths.releases_dir / "1.0" / "release.toml").write_text('version = "1.0"\n')
        assert record.view(paths, "1.0", "root") is None

    def test_last_exit_names_a_signal_or_a_code(self, tmp_path: Path) -> None:
        """An exit by a signal is recorded by the signal's name, else by its code."""
        assert record.Exit.of(-9, 0.0) == record.Exit(None, "SIGKILL", "1970-01-01T00:00:00Z")
        assert record.Exit.of(3, 0.0).words() == "exited with status 3"
        paths = _record(tmp_path, running=False, last_exit=record.Exit.of(-9, 0.0))
        data = json.loads(paths.workload_file.read_text())
        assert data["last_exit"] == {"code": None, "signal": "SIGKILL",
                                     "time": "1970-01-01T00:00:00Z"}
