#!/usr/bin/python
# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""agent_fsm.fleet.info: a node's agent-fsm status and the tail of its history."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: info
short_description: Read a node's agent-fsm status and recent history
description:
  - Runs C(agent-fsm status --json) and C(agent-fsm history --json) on the node and returns them,
    with the free space of the node's state directory.
  - Reads nothing but agent-fsm's own answers; changes nothing on the node.
  - The agent-fsm run is O(binary) if given, else the selected release's C(bin/agent-fsm)
    (C(<state_dir>/selected/bin/agent-fsm), state_dir read from the config).
    A node where no release is selected yet (and no O(binary) given) answers RV(installed=false)
    and no status.
version_added: 0.1.0
author:
  - agent-fsm contributors (@agent-fsm)
options:
  binary:
    description:
      - The C(agent-fsm) program to run on the node.
      - Default is the selected release's C(bin/agent-fsm).
    type: path
  history:
    description:
      - How many of the latest transitions to return; with 0 the history is not read.
    type: int
    default: 10
extends_documentation_fragment:
  - agent_fsm.fleet.node
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to show.
notes:
  - Safe in check mode; never reports a change.
seealso:
  - module: agent_fsm.fleet.upgrade
"""

EXAMPLES = r"""
- name: Read the node's agent-fsm state
  agent_fsm.fleet.info:
    config: /etc/agent-fsm/config.toml
  register: agent

- name: Say where it stands
  ansible.builtin.debug:
    msg: "{{ agent.status.selected }} ({{ agent.status.state }}, gate {{ agent.status.gate }})"
  when: agent.installed
"""

RETURN = r"""
installed:
  description: Whether a release is selected on the node.
  returned: always
  type: bool
  sample: true
status:
  description:
    - The node's C(agent-fsm status --json) object.
    - Its keys are documented in agent-fsm's docs/operations.md.
  returned: when an agent-fsm was found (a release is selected, or O(binary) is given)
  type: dict
  sample: {"state": "converged", "selected": "2.0.0", "last_good": "2.0.0", "gate": "open", "signal": null}
history:
  description: The latest transitions (C(agent-fsm history --json)), oldest first.
  returned: when an agent-fsm was found (a release is selected, or O(binary) is given)
  type: list
  elements: dict
  sample: [{"trigger": "complete", "from": "judged_ok", "to": "converged"}]
state_dir:
  description: The node's state directory, from its config.
  returned: always
  type: str
  sample: /var/lib/agent-fsm
config:
  description: The config file used.
  returned: always
  type: str
  sample: /etc/agent-fsm/config.toml
binary:
  description: The agent-fsm program run, or null when none was found.
  returned: always
  type: str
  sample: /var/lib/agent-fsm/selected/bin/agent-fsm
free_bytes:
  description: Bytes available on the file system of the state directory (or its nearest existing parent).
  returned: always
  type: int
  sample: 10737418240
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.agent_fsm.fleet.plugins.module_utils.node import (  # noqa: E402
    Cli,
    NodeError,
    config_path,
    find_binary,
    free_bytes,
    state_dir,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="path"),
            binary=dict(type="path"),
            history=dict(type="int", default=10),
        ),
        supports_check_mode=True,
    )
    config = config_path(module.params["config"])
    result = dict(changed=False, installed=False, config=config, binary=None)
    try:
        state = state_dir(config)
        result.update(state_dir=state, free_bytes=free_bytes(state))
        binary = find_binary(module.params["binary"], state)
        result["binary"] = binary
        if binary is not None:
            cli = Cli(module, binary, config)
            status = cli.status()
            limit = module.params["history"]
            result.update(installed=bool(status.get("selected")), status=status,
                          history=cli.history(limit) if limit > 0 else [])
    except NodeError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
