"""`[judgment] checks` read from the host's config: commands named by absolute path and HTTP(S)
check tables, every wrong value refused at load in one line naming its key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_fsm.errors import ConfigError
from agent_fsm.node import config as config_mod
from agent_fsm.node.check_config import HttpCheck

SOURCE = Path("/etc/agent-fsm/config.toml")


def _checks(*checks: Any) -> tuple[Any, ...]:
    return config_mod.parse({"judgment": {"checks": list(checks)}}, SOURCE).judgment.checks


class TestChecks:
    def test_commands_and_http_checks_side_by_side(self) -> None:
        """An argv and an HTTP table are both checks; the table's status and timeout default
        to 200 and 5 s."""
        assert _checks(["/usr/bin/curl", "-fsS", "http://127.0.0.1/"],
                       {"http": "http://127.0.0.1:8080/healthz"},
                       {"http": "https://node.example/ready", "status": 204,
                        "timeout_seconds": 2}) == (
            ("/usr/bin/curl", "-fsS", "http://127.0.0.1/"),
            HttpCheck("http://127.0.0.1:8080/healthz", 200, 5.0),
            HttpCheck("https://node.example/ready", 204, 2.0))

    @pytest.mark.parametrize("argv", [["curl", "-fsS", "http://127.0.0.1/"], ["./check.sh"],
                                      ["bin/check"], [], [""]])
    def test_a_command_not_named_by_absolute_path_is_refused(self, argv: list[str]) -> None:
        """A check whose first word is not an absolute path is refused, as a hook's is: root
        runs it, and $PATH or the working directory must not decide what."""
        with pytest.raises(ConfigError) as caught:
            _checks(["/bin/true"], argv)
        assert str(caught.value).startswith(f"config {SOURCE}: `judgment.checks[1]` is ")
        assert "the first an absolute path" in str(caught.value)

    @pytest.mark.parametrize(("table", "key", "expected"), [
        ({"http": "ftp://127.0.0.1/"}, "http", "an http:// or https:// URL"),
        ({"http": "127.0.0.1:8080/healthz"}, "http", "an http:// or https:// URL"),
        ({"http": "http:///healthz"}, "http", "an http:// or https:// URL"),
        ({"http": "http://127.0.0.1:99999/"}, "http", "an http:// or https:// URL"),
        ({"http": "http://127.0.0.1/ x"}, "http", "an http:// or https:// URL"),
        ({"http": 8080}, "http", "an http:// or https:// URL"),
        ({"http": "http://h/", "status": 99}, "status", "an HTTP status code from 100 to 599"),
        ({"http": "http://h/", "status": 600}, "status", "an HTTP status code from 100 to 599"),
        ({"http": "http://h/", "status": "200"}, "status", "an HTTP status code"),
        ({"http": "http://h/", "status": True}, "status", "an HTTP status code"),
        ({"http": "http://h/", "timeout_seconds": 0}, "timeout_seconds", "above 0, at most 3600"),
        ({"http": "http://h/", "timeout_seconds": -1}, "timeout_seconds", "above 0"),
        ({"http": "http://h/", "timeout_seconds": 1e9}, "timeout_seconds", "at most 3600"),
        ({"http": "http://h/", "timeout_seconds": float("nan")}, "timeout_seconds", "finite"),
    ])
    def test_a_wrong_http_value_is_refused_naming_its_key(self, table: dict[str, Any], key: str,
                                                         expected: str) -> None:
        """Each wrong value of an HTTP check is refused in one line naming the key, the value
        and what is expected."""
        with pytest.raises(ConfigError) as caught:
            _checks(table)
        text = str(caught.value)
        assert "\n" not in text
        assert text.startswith(f"config {SOURCE}: `judgment.checks[0].{key}` is ")
        assert expected in text

    def test_an_unknown_key_of_an_http_check_is_refused(self) -> None:
        """A misspelt key (`timeout` for `timeout_seconds`) is refused, naming it and the keys
        an HTTP check knows."""
        with pytest.raises(ConfigError) as caught:
            _checks({"http": "http://h/", "timeout": 2})
        assert str(caught.value) == (
            f"config {SOURCE}: unknown key `judgment.checks[0].timeout`; known keys of an HTTP "
            "check: http, status, timeout_seconds")

    def test_a_table_without_http_is_refused(self) -> None:
        """A check table that names no URL is refused, showing what one looks like."""
        with pytest.raises(ConfigError, match=r"`judgment.checks\[0\]` has no `http`"):
            _checks({"status": 200})

    def test_http_checks_are_kept_as_they_were_read(self) -> None:
        """The settings kept with the last-good read back to the same checks, HTTP ones too."""
        config = config_mod.parse({"judgment": {"checks": [
            ["/bin/true"], {"http": "http://127.0.0.1:8080/healthz", "status": 204}]}}, SOURCE)
        again = config_mod.parse(config_mod.to_table(config), SOURCE)
        assert again.judgment.checks == config.judgment.checks

    def test_status_refuses_a_relative_check_in_one_line(self, tmp_path: Path) -> None:
        """An operator command on a config with a relative check exits 1 with one line naming
        the check, no traceback."""
        cfg = tmp_path / "config.toml"
        cfg.write_text(f'name = "agent"\nstate_dir = "{tmp_path}/state"\n'
                       '[judgment]\nchecks = [["true"]]\n')
        proc = subprocess.run([sys.executable, "-m", "agent_fsm", "--config", str(cfg), "status"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"agent-fsm: config {cfg}: `judgment.checks[0]` is ['true']; expected a non-empty "
            'list of strings, the first an absolute path, e.g. ["/usr/bin/curl", "-fsS", '
            '"http://127.0.0.1:8080/healthz"] or { http = "http://127.0.0.1:8080/healthz" }')
