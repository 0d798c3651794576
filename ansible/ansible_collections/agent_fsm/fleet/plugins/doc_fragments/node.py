# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""Documentation the agent_fsm.fleet modules share: what a node needs, how they find its config."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  platform:
    support: full
    platforms: posix
    description: Nodes with systemd and Python 3.11 or later.
requirements:
  - Python 3.11 or later on the node (C(tomllib)).
options:
  config:
    description:
      - The agent-fsm config file on the node.
      - Default is E(AGENT_FSM_CONFIG) in the module's environment, else C(/etc/agent-fsm/config.toml).
    type: path
"""
