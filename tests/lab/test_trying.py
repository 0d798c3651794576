"""`try`'s config: the user's, as TOML again, with only the lab's places changed; its way back's
kills."""

from __future__ import annotations

import os
import subprocess
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from agent_fsm.node import config as config_mod
from agent_fsm_lab.lab import Lab
from agent_fsm_lab.trying import PLACES, _killed_at_start, lab_config, toml_text

YOURS = '''
name = "myagent"
state_dir = "/var/lib/myagent"
publish_command = ["/usr/local/bin/publish", "--to", "fleet \\"a\\""]
[judgment]
deadline_seconds = 20.5
max_attempts = 3
checks = [{ http = "http://127.0.0.1:8080/healthz", timeout_seconds = 2 }, ["/bin/true"]]
[workload]
user = "nobody"
environment = { LOG_LEVEL = "info", MODE = "a b" }
[hooks.before]
begin_upgrade = ["/bin/echo", "before"]
'''

LABS = '''name = "agent"
state_dir = "/lab/state"
lib_dir = "/lab/lib"
unit_dir = "/etc/systemd/system"
run_dir = "/run/agent"
python = "/usr/bin/python3"
bin_link = "/lab/bin/agent-fsm"
[judgment]
deadline_seconds = 6
'''


def _lab(tmp_path: Path) -> Lab:
    (tmp_path / "lab.toml").write_text(LABS)
    return cast(Lab, SimpleNamespace(config=tmp_path / "lab.toml"))


class TestLabConfig:
    def test_the_toml_reads_back_as_it_was_written(self) -> None:
        """Tables, dotted tables, inline tables in arrays and quoted keys survive the trip."""
        data = {**tomllib.loads(YOURS), "odd": {"WITH SPACE": True, "a.b": [1, 2.5, "é"]}}
        assert tomllib.loads(toml_text(data)) == data

    def test_yours_with_the_labs_places(self, tmp_path: Path) -> None:
        """The user's judgment, workload and hooks stay; the places are the lab's; `python` is
        one line before any table, as a release's launcher reads it; agent-fsm loads it."""
        yours = tmp_path / "node.toml"
        yours.write_text(YOURS)
        text = lab_config(_lab(tmp_path), yours)
        data: dict[str, Any] = tomllib.loads(text)
        ours = tomllib.loads(LABS)
        assert {k: data[k] for k in PLACES} == {k: ours[k] for k in PLACES}
        mine = tomllib.loads(YOURS)
        assert data["judgment"] == mine["judgment"] and data["workload"] == mine["workload"]
        assert data["hooks"] == mine["hooks"]
        assert text.startswith('python = "/usr/bin/python3"\n')
        path = tmp_path / "written.toml"
        path.write_text(text)
        assert config_mod.load(path).name == "agent"


def test_a_candidate_gone_before_it_is_killed_is_not_an_error(tmp_path: Path) -> None:
    """The way back's proof asks systemd for the agent's MainPID, then finds that process: one
    that exited in between (a start the agent's own restart ended) is passed over, and `try` goes
    on to its verdict instead of stopping with a traceback."""
    state = tmp_path / "state"
    (tmp_path / "releases" / "2.0.0").mkdir(parents=True)
    state.mkdir()
    os.symlink(tmp_path / "releases" / "2.0.0", state / "selected")
    (state / "upgrade-signal.json").write_text("{}")
    looked: list[int] = []

    def host_pid(pid: int) -> int:
        looked.append(pid)
        raise LookupError(f"no process is PID {pid} in the sandbox")

    def cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        time.sleep(0.3)  # long enough for the loop to look at least once
        return subprocess.CompletedProcess(list(args), 4, "", "")

    sb = SimpleNamespace(show=lambda unit, prop: "240", host_pid=host_pid)
    lab = cast(Lab, SimpleNamespace(
        sb=sb, state_dir=state, cli=cli,
        status=lambda: {"last_result": {"to": "2.0.0", "outcome": "rolled_back"}}))
    verdict, kills = _killed_at_start(lab, "2.0.0", 5.0)
    assert looked and kills == 0
    assert (verdict.exit_code, verdict.outcome) == (4, "rolled_back")
