"""`try`'s config: the user's, as TOML again, with only the lab's places changed."""

from __future__ import annotations

import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from agent_fsm.node import config as config_mod
from agent_fsm_lab.lab import Lab
from agent_fsm_lab.trying import PLACES, lab_config, toml_text

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
