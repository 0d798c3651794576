"""Inhibitors: a workload's file in the inhibitor directory refuses upgrades while it exists;
a stale one (its PID gone) is reported and not honoured; a garbled one still counts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent_fsm.actions.upgrade import begin_upgrade
from agent_fsm.errors import ConfigError, Refused
from agent_fsm.node import config as config_mod
from agent_fsm.node.runtime import inhibitors
from agent_fsm.views.metrics import collect, exposition
from agent_fsm.views.status.report import status
from tests.actions import test_hold
from tests.actions.test_hold import cli
from tests.helpers import World

# test_hold's node, converged on 1.0.0 with 2.0.0 stored, built once per module.
template, cfg, ready = test_hold.template, test_hold.cfg, test_hold.ready

GONE = 4_194_000  # a PID above any this test machine hands out (pid_max is 4194304 at most)


def where(world: World) -> Path:
    d = world.paths.real(world.node.config.inhibitor_dir)
    d.mkdir(parents=True, exist_ok=True)
    return d


def drop(world: World, name: str, body: str | bytes) -> Path:
    path = where(world) / name
    if isinstance(body, str):
        path.write_text(body)
    else:
        path.write_bytes(body)
    return path


class TestFormat:
    def test_the_documented_printf_line_is_read(self, ready: World) -> None:
        """The example in docs/operations.md, as a shell writes it, reads back as written."""
        path = where(ready) / "backup"
        subprocess.run(["sh", "-c", f"printf 'name=%s\\nreason=%s\\npid=%s\\n' nightly-backup "
                        f"'copying the database' $$ > {path}"], check=True)
        (found,) = inhibitors.scan(where(ready))
        assert (found.name, found.reason, found.error, found.stale) == (
            "nightly-backup", "copying the database", None, True)  # the shell has exited
        assert found.pid is not None and found.file == str(path)

    def test_comments_quotes_defaults_and_other_keys(self, ready: World) -> None:
        """Blank lines and `#` comments are skipped, quotes around a value dropped, unknown keys
        ignored, the name defaults to the file's; dot-files are not inhibitors."""
        drop(ready, "db", '# taken by db.service\n\nreason="schema migration"\nowner=dba\n')
        drop(ready, ".db.tmp", "garbage being written")
        (found,) = inhibitors.scan(where(ready))
        assert (found.name, found.reason, found.pid, found.error) == (
            "db", "schema migration", None, None)

    @pytest.mark.parametrize(("body", "says"), [
        ("name=x\n", "no reason= line"), ("reason=x\npid=abc\n", "pid='abc'"),
        ("reason=x\npid=0\n", "pid='0'"), ("just words\n", "line 1 is not KEY=value"),
        (b"reason=\xff\n", "not UTF-8"), ("reason=" + "x" * 5000, "larger than 4096"),
        ("reason=a\x1bb\n", "reason= on line 1"),
    ])
    def test_a_garbled_file_still_inhibits_and_is_named(self, ready: World, body: str | bytes,
                                                        says: str) -> None:
        """A file not in the format counts as an inhibitor (fail safe), with what is wrong."""
        path = drop(ready, "bad", body)
        (found,) = inhibitors.scan(where(ready))
        assert found.error is not None and says in found.error and not found.stale
        refusal = inhibitors.refusal((found,))
        assert refusal is not None and str(path) in str(refusal)

    def test_links_fifos_and_directories_inhibit_without_being_followed(self, ready: World,
                                                                       tmp_path: Path) -> None:
        """A symlink, a FIFO (never blocked on) or a directory in the directory counts as an
        unreadable inhibitor; a missing directory means none; one that cannot be listed
        counts as one."""
        (tmp_path / "target").write_text("reason=elsewhere\n")
        (where(ready) / "link").symlink_to(tmp_path / "target")
        os.mkfifo(where(ready) / "fifo")
        (where(ready) / "dir").mkdir()
        found = inhibitors.scan(where(ready))
        assert [(i.name, i.error is not None) for i in found] == [
            ("dir", True), ("fifo", True), ("link", True)]
        assert inhibitors.scan(tmp_path / "absent") == ()
        (listed,) = inhibitors.scan(tmp_path / "target")  # not a directory
        assert listed.error is not None and "cannot be listed" in listed.error


class TestRefusal:
    def test_upgrade_is_refused_listing_the_inhibitors(self, ready: World, cfg: Path) -> None:
        """With an inhibitor in place `upgrade` exits 3 in one line listing each (name, pid,
        reason, file) and how it is lifted; once the file is removed the upgrade goes."""
        alive = drop(ready, "db", f"name=db\nreason=schema migration\npid={os.getpid()}\n")
        drop(ready, "old", f"reason=left behind\npid={GONE}\n")
        proc = cli(ready, cfg, "upgrade", "--to", "2.0.0")
        assert proc.returncode == 3, proc.stderr
        line = proc.stderr.strip()
        assert "\n" not in line and "Traceback" not in line
        for part in (f"db (pid {os.getpid()}): 'schema migration'", str(alive),
                     "1 stale, not honoured", "removes its file", "--force"):
            assert part in line, part
        assert ready.node.signal() is None
        alive.unlink()
        assert begin_upgrade(ready.node, "2.0.0").state == "candidate_running"

    def test_a_stale_inhibitor_does_not_refuse(self, ready: World) -> None:
        """An inhibitor whose PID no longer exists is reported stale and refuses nothing."""
        drop(ready, "old", f"reason=left behind\npid={GONE}\n")
        (shown,) = status(ready.node).inhibitors
        assert shown["stale"] is True and shown["pid"] == GONE
        assert begin_upgrade(ready.node, "2.0.0").state == "candidate_running"

    def test_force_goes_past_inhibitors(self, ready: World) -> None:
        """`--force` starts the upgrade though a live inhibitor and a garbled one exist."""
        drop(ready, "db", f"reason=migration\npid={os.getpid()}\n")
        drop(ready, "junk", b"\x00\xff")
        with pytest.raises(Refused, match="inhibited by 2 workload"):
            begin_upgrade(ready.node, "2.0.0")
        assert begin_upgrade(ready.node, "2.0.0", force=True).state == \
            "candidate_running"


class TestShown:
    def test_status_json_lists_them_and_metrics_count_them(self, ready: World) -> None:
        """`status --json` lists each inhibitor with its fields (stale ones marked);
        `agent_fsm_inhibitors` counts active and stale."""
        drop(ready, "db", f"reason=migration\npid={os.getpid()}\n")
        drop(ready, "old", f"reason=left behind\npid={GONE}\n")
        drop(ready, "junk", "?")
        data = status(ready.node).to_json()
        assert data["hold"] is None
        assert [(i["name"], i["stale"], i["error"] is not None) for i in data["inhibitors"]] == [
            ("db", False, False), ("junk", False, True), ("old", True, False)]
        assert set(data["inhibitors"][0]) == {"file", "name", "reason", "pid", "since", "stale",
                                              "error"}
        text = exposition(collect(ready.node))
        assert 'agent_fsm_inhibitors{agent="agent",status="active"} 2' in text
        assert 'agent_fsm_inhibitors{agent="agent",status="stale"} 1' in text
        json.dumps(data)

    def test_human_status_says_how_each_is_lifted(self, ready: World, cfg: Path) -> None:
        """Human `status` names each inhibitor, its file to remove, and marks stale ones."""
        path = drop(ready, "db", f"reason=migration\npid={os.getpid()}\n")
        drop(ready, "old", f"reason=left behind\npid={GONE}\n")
        out = cli(ready, cfg, "status").stdout
        assert f"refuses upgrades until its workload removes {path}" in out
        assert "stale" in out and "not honoured" in out


class TestConfig:
    @pytest.mark.parametrize("value", ["/var/lib/inhibit", "/run", "/run/agent-fsm",
                                       "/run/agent-fsm/inhibit", "run/x", "/run/x/"])
    def test_inhibitor_dir_is_a_runtime_dir_apart_from_the_gate(self, value: str) -> None:
        """`inhibitor_dir` must be below /run (cleared at boot) and apart from `run_dir`
        (systemd removes that whenever the agent stops)."""
        with pytest.raises(ConfigError, match="inhibitor_dir"):
            config_mod.parse({"inhibitor_dir": value}, Path("/etc/agent-fsm/config.toml"))

    def test_default_and_a_good_value(self) -> None:
        """The default is /run/agent-fsm-inhibitors; another directory below /run is taken."""
        assert config_mod.Config().inhibitor_dir == Path("/run/agent-fsm-inhibitors")
        parsed = config_mod.parse({"inhibitor_dir": "/run/workloads/inhibit"}, Path("/c.toml"))
        assert parsed.inhibitor_dir == Path("/run/workloads/inhibit")
