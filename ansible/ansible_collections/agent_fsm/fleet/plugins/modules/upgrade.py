#!/usr/bin/python
# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""agent_fsm.fleet.upgrade: bring a node to a stored release, installing or upgrading."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: upgrade
short_description: Install or upgrade agent-fsm on a node to a stored release
description:
  - Brings the node to release O(version), which must already be stored on it
    (see M(agent_fsm.fleet.release)).
  - An idle node (nothing installed) is installed with C(agent-fsm install --version VERSION) and,
    with O(wait), followed until it rests (converged, gate open).
  - A converged node on another release is upgraded with C(agent-fsm upgrade --to VERSION),
    followed to its judgment with O(wait). A candidate that fails its judgment rolls the node back
    to its last-good release; the task then fails with RV(rolled_back=true).
  - A node already converged on O(version) is left alone (not changed).
  - A node where an upgrade is pending or the startup gate is closed is refused by agent-fsm;
    the task then fails with RV(refused=true).
version_added: 0.1.0
author:
  - agent-fsm contributors (@agent-fsm)
options:
  version:
    description:
      - The release to run, as stored on the node.
    type: str
    required: true
  binary:
    description:
      - The C(agent-fsm) program to run on the node.
      - Default is the selected release's C(bin/agent-fsm), else (an idle node) the stored O(version)'s own.
    type: path
  wait:
    description:
      - Follow the install or upgrade to its end (converged, or rolled back).
      - Without it the task returns as soon as the upgrade has started.
    type: bool
    default: true
  timeout:
    description:
      - With O(wait), seconds to follow before failing. The node carries on alone after that.
    type: float
    default: 600
  force:
    description:
      - Pass C(--force) to C(agent-fsm upgrade), for agent-fsm versions that offer it.
    type: bool
    default: false
extends_documentation_fragment:
  - agent_fsm.fleet.node
attributes:
  check_mode:
    support: full
    description: Reads the node's status and says whether it would install or upgrade; runs nothing else.
  diff_mode:
    support: full
    description: Shows the selected version and state before and after (predicted in check mode).
notes:
  - agent-fsm's exit codes map to the result, 0 done, 3 refused (RV(refused)),
    4 rolled back (RV(rolled_back)).
seealso:
  - module: agent_fsm.fleet.release
  - module: agent_fsm.fleet.info
"""

EXAMPLES = r"""
- name: Upgrade to 2.1.0 and follow the judgment for at most five minutes
  agent_fsm.fleet.upgrade:
    version: 2.1.0
    timeout: 300
  register: upgrade

- name: Start the upgrade only (follow it later with agent_fsm.fleet.info)
  agent_fsm.fleet.upgrade:
    version: 2.1.0
    config: /etc/agent-fsm/config.toml
    wait: false
"""

RETURN = r"""
status:
  description:
    - The node's C(agent-fsm status --json) after the task (before it, in check mode).
    - Its keys are documented in agent-fsm's docs/operations.md.
  returned: when the node's agent-fsm could be run
  type: dict
  sample: {"state": "converged", "selected": "2.1.0", "last_good": "2.1.0", "gate": "open", "signal": null}
action:
  description: What was done (or would be, in check mode), V(install), V(upgrade) or V(none).
  returned: always
  type: str
  sample: upgrade
previous:
  description: The release selected before the task, or null on an idle node.
  returned: when the node's agent-fsm could be run
  type: str
  sample: 2.0.0
rolled_back:
  description: Whether the candidate failed its judgment and the node rolled back to its last-good.
  returned: always
  type: bool
  sample: false
refused:
  description: Whether agent-fsm refused the operation (gate closed, upgrade pending, or not allowed now).
  returned: always
  type: bool
  sample: false
msg:
  description: One line saying what happened.
  returned: always
  type: str
  sample: upgraded 2.0.0 -> 2.1.0
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.agent_fsm.fleet.plugins.module_utils.node import (  # noqa: E402
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_ROLLED_BACK,
    Cli,
    NodeError,
    config_path,
    find_binary,
    last_line,
    settled,
    state_dir,
    summary,
    wait_settled,
)


def plan(status, version):
    """What bringing a node in `status` to `version` takes: V(none), V(install) or V(upgrade)."""
    if status.get("state") == "idle":
        return "install"
    if status.get("selected") == version and settled(status):
        return "none"
    return "upgrade"


def predicted(status, version, action):
    """The status the diff shows as `after` in check mode."""
    if action == "none":
        return status
    return dict(status, selected=version, state="converged")


def run(module, cli, version, action):
    """Install or upgrade; the result's fields (failed, msg, rolled_back, refused)."""
    params = module.params
    if action == "install":
        argv = ["install", "--version", version]
    else:
        argv = ["upgrade", "--to", version]
        if params["wait"]:
            argv += ["--wait", "--timeout", f"{params['timeout']:g}"]
        if params["force"]:
            argv.append("--force")
    rc, out, err = cli.run(*argv)
    if rc == EXIT_ROLLED_BACK:
        return dict(failed=True, rolled_back=True,
                    msg=f"{version} was judged failed; the node rolled back: {last_line(err, out)}")
    if rc == EXIT_REFUSED:
        return dict(failed=True, refused=True,
                    msg=f"agent-fsm refused to {action} {version}: {last_line(err, out)}")
    if rc != EXIT_OK:
        return dict(failed=True,
                    msg=f"agent-fsm {' '.join(argv)} failed (exit {rc}): {last_line(err, out)}")
    if action == "install" and params["wait"]:
        rests, status = wait_settled(cli, params["timeout"])
        if not rests:
            return dict(failed=True, msg=f"{version} was installed but the node did not rest (converged, "
                        f"gate open) within {params['timeout']:g}s; it is {status.get('state')}: "
                        "run agent-fsm status on the node")
    return dict(failed=False, msg=last_line(out) if out.strip() else f"{action} {version}")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            version=dict(type="str", required=True),
            config=dict(type="path"),
            binary=dict(type="path"),
            wait=dict(type="bool", default=True),
            timeout=dict(type="float", default=600),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    version = module.params["version"]
    config = config_path(module.params["config"])
    result = dict(changed=False, action="none", rolled_back=False, refused=False)
    try:
        state = state_dir(config)
        stored = os.path.join(state, "releases", version, "bin", "agent-fsm")
        binary = find_binary(module.params["binary"], state, stored)
        if binary is None and module.check_mode:
            result.update(changed=True, action="install",
                          msg=f"would install {version} (not stored on the node yet, nothing installed)")
            module.exit_json(**result)
        if binary is None:
            where = os.path.join(state, "releases")
            module.fail_json(msg=f"no agent-fsm on this node and release {version} is not stored in {where}: "
                             "add it first (agent_fsm.fleet.release)", **result)
        cli = Cli(module, binary, config)
        before = cli.status()
        action = plan(before, version)
        result.update(action=action, previous=before.get("selected"), status=before)
        if action == "none":
            result["msg"] = f"already converged on {version}"
            module.exit_json(**result)
        result["changed"] = True
        if module.check_mode:
            after = predicted(before, version, action)
            now = summary(before).replace("\n", " ").strip()
            result["msg"] = f"would {action} {version} (now {now})"
        else:
            result.update(run(module, cli, version, action))
            after = cli.status()
            result["status"] = after
        if module._diff:
            result["diff"] = dict(before=summary(before), after=summary(after))
    except NodeError as exc:
        module.fail_json(msg=str(exc), **result)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
