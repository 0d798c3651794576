# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""What the agent_fsm.fleet modules share: the node's config, its agent-fsm and its status."""

from __future__ import annotations

import json
import os
import time

try:
    import tomllib
except ImportError:  # Python < 3.11: agent-fsm releases need 3.11 anyway
    tomllib = None

DEFAULT_CONFIG = "/etc/agent-fsm/config.toml"
DEFAULT_STATE_DIR = "/var/lib/agent-fsm"
CONFIG_ENV = "AGENT_FSM_CONFIG"

# agent-fsm's exit codes (docs/operations.md).
EXIT_OK = 0
EXIT_REFUSED = 3
EXIT_ROLLED_BACK = 4


class NodeError(Exception):
    """The node cannot be driven: no config, no agent-fsm, an unreadable answer."""


def config_path(option):
    """The config file agent-fsm reads on this node: the option, $AGENT_FSM_CONFIG, the default."""
    return option or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def state_dir(config):
    """The node's state_dir, read from its config (the default when the default file is absent)."""
    if tomllib is None:
        raise NodeError("this node's python is older than 3.11 (no tomllib); agent-fsm needs 3.11")
    try:
        with open(config, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        if config == DEFAULT_CONFIG:
            return DEFAULT_STATE_DIR
        raise NodeError(f"config file {config} does not exist on this node; "
                        "create it or set `config`") from None
    except (OSError, ValueError) as exc:
        raise NodeError(f"config file {config} cannot be read: {exc}") from None
    value = data.get("state_dir", DEFAULT_STATE_DIR)
    if not isinstance(value, str):
        raise NodeError(f"config file {config}: state_dir is {value!r}, not a path")
    return value


def find_binary(option, state, *fallbacks):
    """The agent-fsm to run: the option, else the selected release's, else the first fallback
    that exists (a stored or uploaded release's own); None when there is none yet."""
    if option:
        return option
    for candidate in (os.path.join(state, "selected", "bin", "agent-fsm"), *fallbacks):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Cli:
    """Runs the node's agent-fsm through the module's run_command, with the chosen config."""

    def __init__(self, module, binary, config):
        self.module = module
        self.binary = binary
        self.config = config

    def run(self, *args):
        """(rc, stdout, stderr) of `agent-fsm --config CONFIG ARGS...`."""
        argv = [self.binary, "--config", self.config, *args]
        return self.module.run_command(argv, environ_update={"NO_COLOR": "1", "COLUMNS": "200"})

    def json(self, *args):
        """The JSON that `agent-fsm ARGS... --json` prints; NodeError when it fails."""
        rc, out, err = self.run(*args, "--json")
        command = " ".join(args)
        if rc != EXIT_OK:
            raise NodeError(f"agent-fsm {command} failed (exit {rc}): {last_line(err, out)}")
        try:
            return json.loads(out)
        except ValueError as exc:
            raise NodeError(f"agent-fsm {command} --json printed no JSON ({exc}): {out[:200]}") from None

    def status(self):
        return self.json("status")

    def history(self, limit):
        return self.json("history", "--limit", str(limit))

    def releases(self):
        return self.json("release", "list")


def settled(status):
    """Whether the node rests: converged, gate open, no upgrade pending, nothing owed."""
    return (status.get("state") == "converged" and status.get("gate") == "open"
            and status.get("signal") is None and status.get("owed") is None)


def wait_settled(cli, timeout, interval=0.5):
    """Poll `status --json` until the node rests; (settled, last status)."""
    end = time.monotonic() + timeout
    while True:
        status = cli.status()
        if settled(status) or time.monotonic() >= end:
            return settled(status), status
        time.sleep(interval)


def summary(status):
    """Version and state in two lines, the text a diff compares."""
    if status is None:
        return "version: (none)\nstate: (not installed)\n"
    return "version: {}\nstate: {}\n".format(status.get("selected") or "(none)", status.get("state"))


def free_bytes(path):
    """Bytes available on the file system that holds `path` (or its nearest existing parent)."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    stat = os.statvfs(path or "/")
    return stat.f_bavail * stat.f_frsize


def shown(text):
    """`text` as a message shows it: as it is when printable, else quoted with its control
    characters escaped (a path names no line break or terminal escape into a message)."""
    return text if text.isprintable() else repr(text)


def last_line(*texts):
    """The last non-empty line of the first text that has one (agent-fsm's one error line)."""
    for text in texts:
        lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return "(no output)"
