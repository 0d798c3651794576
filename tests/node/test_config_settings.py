"""The config's keys are declared once, in `config.SETTINGS`: every value the records hold is a
key of the file, and every key is a value of the records."""

from __future__ import annotations

from agent_fsm.node import config as config_mod
from agent_fsm.node.config import Config, Judgment, WorkloadConfig
from agent_fsm.node.hook_config import HookConfig
from agent_fsm.views.doctor import config_modes
from tests.node.test_kept_settings import every_setting_off_its_default

TABLES = {"judgment": Judgment, "hooks": HookConfig, "workload": WorkloadConfig}


class TestSettings:
    def test_every_field_of_the_records_is_a_key(self) -> None:
        """Each field of the config's records is one setting of the table, and nothing else is:
        a value added to a record and not to the table fails here."""
        declared = {s.key for s in config_mod.SETTINGS}
        fields = {f for f in Config._fields if f not in {"source", "fallback", *TABLES}}
        fields |= {f"{table}.{f}" for table, record in TABLES.items() for f in record._fields}
        assert declared == fields
        assert len(config_mod.SETTINGS) == len(declared)


class TestDoctor:
    def test_doctor_checks_every_program_the_config_has_root_run(self) -> None:
        """`doctor` checks the modes of every program a setting names by absolute path: the
        checks', the hooks', the publish command's, systemctl's and podman's."""
        off = every_setting_off_its_default()
        assert config_modes.programs(off) == sorted({
            "/bin/true", "/usr/local/sbin/drain", "/usr/local/sbin/undrain", "/usr/bin/publish",
            "/usr/bin/systemctl", "/usr/bin/podman"})
