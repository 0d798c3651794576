"""The config's keys are declared once, in `config.SETTINGS`: every value the records hold is a
key of the file, and every key is a value of the records."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.node import config as config_mod
from agent_fsm.node.channel_config import ChannelConfig
from agent_fsm.node.config import Config, Judgment, WorkloadConfig
from agent_fsm.node.hook_config import HookConfig
from agent_fsm.node.store_config import StoreConfig
from agent_fsm.views.doctor import config_modes
from agent_fsm.views.doctor.checks import doctor
from tests.helpers import make_world
from tests.node.test_kept_settings import every_setting_off_its_default

REPO = Path(__file__).resolve().parents[2]

TABLES = {"judgment": Judgment, "hooks": HookConfig, "workload": WorkloadConfig,
          "store": StoreConfig, "channel": ChannelConfig}


class TestSettings:
    def test_every_field_of_the_records_is_a_key(self) -> None:
        """Each field of the config's records is one setting of the table, and nothing else is:
        a value added to a record and not to the table fails here."""
        declared = {s.key for s in config_mod.SETTINGS}
        fields = {f for f in Config._fields if f not in {"source", "fallback", *TABLES}}
        fields |= {f"{table}.{f}" for table, record in TABLES.items() for f in record._fields}
        assert declared == fields
        assert len(config_mod.SETTINGS) == len(declared)


def _documented() -> dict[str, str]:
    """docs/configuration.md's list of keys: each key's name there and its default cell."""
    lines = (REPO / "docs" / "configuration.md").read_text().splitlines()
    start = lines.index("| key | default | meaning |") + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        key, default = (cell.strip() for cell in line.split("|")[1:3])
        rows[key.replace("`", "")] = default
    return rows


def _when_each_takes_effect() -> set[str]:
    """The keys of docs/configuration.md's "When a change takes effect" table, as SETTINGS names
    them: a bare name after `[table] key` in a cell is a key of that table."""
    text = (REPO / "docs" / "configuration.md").read_text()
    rows = text.split("| key | a change takes effect |", 1)[1].split("\n\n", 1)[0]
    keys = set()
    for line in rows.splitlines()[2:]:
        table = None
        for item in re.findall(r"`([^`]+)`", line.split("|")[1]):
            named = re.fullmatch(r"\[([a-z_.]+)\](?: (\w+))?", item)
            if named is None:
                keys.add(item if table is None else f"{table}.{item}")
            elif named[2] is None:
                keys.add(named[1])
            else:
                table = named[1]
                keys.add(f"{table}.{named[2]}")
    return keys


def _literal(value: Any) -> str:
    """A default as the docs write it: TOML's words, whole numbers without a point, paths bare."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value) if not isinstance(value, str) or not value.startswith("/") else value


class TestDocs:
    def test_the_docs_list_every_key_and_no_other(self) -> None:
        """docs/configuration.md's key list is the table's: a key added to the table and not
        to the docs (or left in the docs once gone) fails here."""
        assert sorted(_documented()) == sorted(s.shown for s in config_mod.SETTINGS)

    def test_the_docs_say_when_each_key_takes_effect(self) -> None:
        """docs/configuration.md says when a change of each key takes effect, and of no other."""
        assert sorted(_when_each_takes_effect()) == sorted(s.key for s in config_mod.SETTINGS)

    def test_the_defaults_the_docs_write_as_values_are_the_defaults(self) -> None:
        """Where the docs give a default as a value (`200`, `["systemctl"]`), it is the one a
        config without that key gets."""
        documented, defaults = _documented(), config_mod.to_table(Config())
        checked = 0
        for setting in config_mod.SETTINGS:
            cell = documented[setting.shown]
            if cell.count("`") == 2 and cell.startswith("`") and cell.endswith("`"):
                table = defaults if setting.section is None else defaults[setting.section]
                default = table[setting.field]
                assert cell.strip("`") == _literal(default), setting.key
                checked += 1
        assert checked >= 15

    def test_help_names_every_key(self) -> None:
        """`agent-fsm --help` names every key of the config file, table by table."""
        proc = subprocess.run([sys.executable, "-m", "agent_fsm", "--help"], capture_output=True,
                              text=True, timeout=60, check=True, env={**os.environ, "COLUMNS": "200"})
        text = " ".join(proc.stdout.split())
        for setting in config_mod.SETTINGS:
            assert re.search(rf"\b{re.escape(setting.field)}\b", text), setting.key
        for section in TABLES:
            assert f"[{section}]" in text


class TestDoctor:
    def test_doctor_checks_every_program_the_config_has_root_run(self) -> None:
        """`doctor` checks the modes of every program a setting names by absolute path: the
        checks', the hooks', the publish command's, systemctl's and podman's."""
        off = every_setting_off_its_default()
        assert config_modes.programs(off) == sorted({
            "/bin/true", "/usr/local/sbin/drain", "/usr/local/sbin/undrain", "/usr/bin/publish",
            "/usr/bin/systemctl", "/usr/bin/podman"})

    @pytest.mark.parametrize("key", ["state_dir", "lib_dir", "unit_dir", "run_dir"])
    def test_doctor_warns_of_a_writable_path_in_each_of_agent_fsms_directories(
            self, tmp_path: Path, key: str) -> None:
        """A `writable_paths` entry inside one of agent-fsm's directories draws doctor's warning
        that the workload sees it read-only all the same."""
        inside = getattr(Config(), key) / "data"
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'name = "agent"\n[workload]\nuser = "nobody"\nwritable_paths = ["{inside}"]\n')
        world = make_world(tmp_path / "root", config_mod.load(cfg))
        release = world.add_release("1.0.0")
        (release / "release.toml").write_text('version = "1.0.0"\nworkload = ["/bin/myagent"]\n')
        world.record_digest("1.0.0")
        world.installed("1.0.0")
        found = [f.detail for f in doctor(world.node, check_systemd=False) if f.check == "workload"]
        assert any(f"writable path {inside} is inside agent-fsm's" in d for d in found), found
