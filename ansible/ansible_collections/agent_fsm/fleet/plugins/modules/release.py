#!/usr/bin/python
# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""agent_fsm.fleet.release: store a release on a node with `agent-fsm release add`."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release
short_description: Copy an agent-fsm release to a node and store it there
description:
  - Copies a release (a directory made by C(agent-fsm release pack), or a tar archive of one) from the
    controller to the node and stores it with C(agent-fsm release add), which validates it and keeps a
    normalized copy under the node's C(<state_dir>/releases/).
  - Idempotent, a release already stored with the same content is reported unchanged.
    The same version stored with other content is refused by agent-fsm and the task fails with
    RV(refused=true).
  - The agent-fsm run is O(binary) if given, else the selected release's C(bin/agent-fsm), else (an idle node)
    the copied release's own C(bin/agent-fsm), so a node needs only its C(python3) to be bootstrapped.
version_added: 0.1.0
author:
  - agent-fsm contributors (@agent-fsm)
options:
  src:
    description:
      - The release, a directory or a tar archive (C(.tar), C(.tar.gz), C(.tgz), C(.tar.xz)) holding one,
        at its top or in a single top directory.
      - On the controller (searched like M(ansible.builtin.copy) searches its O(src)), unless O(remote_src).
    type: path
    required: true
  remote_src:
    description:
      - O(src) is already on the node; copy nothing.
    type: bool
    default: false
  binary:
    description:
      - The C(agent-fsm) program to run on the node.
    type: path
extends_documentation_fragment:
  - agent_fsm.fleet.node
attributes:
  action:
    support: full
    description: An action plugin copies O(src) from the controller to a temporary directory on the node.
  check_mode:
    support: full
    description:
      - Says whether the version is stored already and stores nothing. A release directory on the
        controller is not even copied (its version is read there and the node's status asked);
        an archive is copied to a temporary directory to read its version.
  diff_mode:
    support: none
    description: Stores a release or not; the result says which.
notes:
  - In check mode a version already stored is reported unchanged without comparing its content.
seealso:
  - module: agent_fsm.fleet.upgrade
"""

EXAMPLES = r"""
- name: Store release 2.1.0, packed on the controller
  agent_fsm.fleet.release:
    src: /srv/releases/agent-fsm-2.1.0

- name: Store a release archive already on the node
  agent_fsm.fleet.release:
    src: /var/cache/agent-fsm-2.1.0.tar.gz
    remote_src: true
    config: /etc/agent-fsm/config.toml
"""

RETURN = r"""
version:
  description: The release's version, from its C(release.toml).
  returned: when the release could be read
  type: str
  sample: 2.1.0
path:
  description: Where the node keeps the stored release.
  returned: when the release could be read
  type: str
  sample: /var/lib/agent-fsm/releases/2.1.0
refused:
  description: Whether agent-fsm refused to store it (the same version is stored with other content).
  returned: always
  type: bool
  sample: false
msg:
  description: agent-fsm's answer, in one line.
  returned: always
  type: str
  sample: release 2.1.0 stored at /var/lib/agent-fsm/releases/2.1.0 (sha256:...)
"""

import os  # noqa: E402
import tarfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.agent_fsm.fleet.plugins.module_utils.node import (  # noqa: E402
    EXIT_OK,
    EXIT_REFUSED,
    Cli,
    NodeError,
    config_path,
    find_binary,
    last_line,
    state_dir,
    tomllib,
)

MANIFEST = "release.toml"


def unpack(archive, into):
    """Extract a release archive into `into`, refusing members that would land outside it or
    that are neither files nor directories (a release holds nothing else)."""
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = os.path.normpath(member.name)
                if name.startswith(("/", "..")) or not (member.isfile() or member.isdir()):
                    raise NodeError(f"{archive}: member {member.name!r} is not a plain file or directory "
                                    "inside the archive")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, filter="data")
            else:  # members checked above
                tar.extractall(into)
    except (OSError, tarfile.TarError) as exc:
        raise NodeError(f"{archive} cannot be extracted: {exc}") from None


def release_root(path):
    """The directory holding release.toml: `path` itself or its single subdirectory."""
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    entries = [e for e in os.listdir(path) if os.path.isdir(os.path.join(path, e))]
    if len(entries) == 1 and os.path.isfile(os.path.join(path, entries[0], MANIFEST)):
        return os.path.join(path, entries[0])
    raise NodeError(f"{path} holds no {MANIFEST} (at its top or in a single top directory): "
                    "not a release from `agent-fsm release pack`")


def version_of(root):
    try:
        with open(os.path.join(root, MANIFEST), "rb") as handle:
            version = tomllib.load(handle).get("version")
    except (OSError, ValueError) as exc:
        raise NodeError(f"{os.path.join(root, MANIFEST)} cannot be read: {exc}") from None
    if not isinstance(version, str) or not version:
        raise NodeError(f"{os.path.join(root, MANIFEST)} names no version")
    return version


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            remote_src=dict(type="bool", default=False),
            config=dict(type="path"),
            binary=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    src = module.params["src"]
    config = config_path(module.params["config"])
    result = dict(changed=False, refused=False)
    try:
        if tomllib is None:
            raise NodeError("this node's python is older than 3.11 (no tomllib); agent-fsm needs 3.11")
        if os.path.isdir(src):
            root = release_root(src)
        elif os.path.isfile(src):
            into = os.path.join(module.tmpdir, "release")
            os.mkdir(into)
            unpack(src, into)
            root = release_root(into)
        else:
            raise NodeError(f"{src} does not exist on the node")
        version = version_of(root)
        state = state_dir(config)
        result.update(version=version, path=os.path.join(state, "releases", version))
        own = os.path.join(root, "bin", "agent-fsm")
        cli = Cli(module, find_binary(module.params["binary"], state, own), config)
        if module.check_mode:
            stored = any(r.get("version") == version for r in cli.releases())
            said = "is stored (content not compared in check mode)" if stored else "would be stored"
            result.update(changed=not stored, msg=f"release {version} {said}")
            module.exit_json(**result)
        rc, out, err = cli.run("release", "add", root)
    except NodeError as exc:
        module.fail_json(msg=str(exc), **result)
    if rc == EXIT_REFUSED:
        result["refused"] = True
        module.fail_json(msg=f"agent-fsm refused to store {version}: {last_line(err, out)}", **result)
    if rc != EXIT_OK:
        module.fail_json(msg=f"agent-fsm release add failed (exit {rc}): {last_line(err, out)}", **result)
    result.update(changed="already stored" not in out, msg=last_line(out))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
