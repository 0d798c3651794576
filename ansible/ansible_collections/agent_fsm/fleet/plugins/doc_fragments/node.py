# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""Documentation the agent_fsm.fleet modules share: how they find the node's config."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  config:
    description:
      - The agent-fsm config file on the node.
      - Default is E(AGENT_FSM_CONFIG) in the module's environment, else C(/etc/agent-fsm/config.toml).
    type: path
"""
