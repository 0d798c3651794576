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
  - The agent-fsm run is O(binary) if given, else the selected release's C(bin/agent-fsm), else (an idle node
    given a release directory) the release's own C(bin/agent-fsm), so a node needs only its C(python3) to be
    bootstrapped.
  - An archive is read by that agent-fsm alone (C(agent-fsm release add ARCHIVE) reads it as a stream,
    within bounds), never by the module. So a node with no agent-fsm yet is bootstrapped from a release
    directory (on the controller, or on the node with O(remote_src)), or with O(binary); an archive given
    to such a node is refused, in one line saying so, before it is read.
version_added: 0.1.0
author:
  - agent-fsm contributors (@agent-fsm)
options:
  src:
    description:
      - The release, a directory or a tar archive (C(.tar), C(.tar.gz), C(.tgz), C(.tar.xz)) holding one,
        at its top or in a single top directory.
      - An archive needs an agent-fsm on the node to read it (see the description).
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
  _packed:
    description:
      - Set by the action plugin alone (a task cannot set it) when O(src) is the tar archive it made of a
        release directory on the controller, the one archive the module unpacks itself (on a node with no
        agent-fsm to read it).
    type: bool
    default: false
extends_documentation_fragment:
  - agent_fsm.fleet.node
attributes:
  action:
    support: full
    description:
      - An action plugin copies O(src) from the controller to a temporary directory on the node; a directory
        as a tar archive it makes of it, which the module unpacks only on a node with no agent-fsm yet.
  check_mode:
    support: full
    description:
      - Says whether the version is stored already and stores nothing. A release directory on the
        controller is not even copied (its version is read there and the node's status asked).
        An archive is not read in check mode (only agent-fsm reads an archive, and only to store it), so it is
        reported as would be stored, with no RV(version).
  diff_mode:
    support: none
    description: Stores a release or not; the result says which.
notes:
  - In check mode a version already stored is reported unchanged without comparing its content.
  - The version of a stored archive is the one agent-fsm's answer names.
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
  description: The release's version, from its C(release.toml) (an archive's as agent-fsm's answer names it).
  returned: when the release could be read (not for an archive in check mode)
  type: str
  sample: 2.1.0
path:
  description: Where the node keeps the stored release.
  returned: when the release could be read (not for an archive in check mode)
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
import re  # noqa: E402
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
    shown,
    state_dir,
    tomllib,
)

MANIFEST = "release.toml"
# `release add`'s answer: "release VERSION [already ]stored at PATH (DIGEST…)".
STORED = re.compile(r"release (\S+) (?:already )?stored at ")


def unpack_packed(archive, into):
    """Unpack the tar archive the action plugin made of a release directory on the controller,
    member by member, keeping no member list; refuse a member that would land outside `into` or
    that is neither a file nor a directory (a release holds nothing else). Only such an archive
    is unpacked here: any other is read by agent-fsm."""
    try:
        with tarfile.open(archive, "r:") as tar:
            while True:
                member = tar.next()
                if member is None:
                    return
                tar.members = []  # the one being extracted is all that is needed
                name = os.path.normpath(member.name)
                if name.startswith(("/", "..")) or not (member.isfile() or member.isdir()):
                    raise NodeError(f"{archive}: member {member.name!r} is not a plain file or directory "
                                    "inside the archive")
                if hasattr(tarfile, "data_filter"):
                    tar.extract(member, into, filter="data")
                else:  # member checked above
                    tar.extract(member, into)
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


def stored_version(out):
    """The version `release add` says it stored, or None when its answer does not say."""
    match = STORED.match(last_line(out))
    return match.group(1) if match else None


def what_to_add(module, src, state):
    """(what `release add` is given, its version or None, the agent-fsm to run): a release
    directory with the version its release.toml names, or an archive agent-fsm reads itself."""
    binary = find_binary(module.params["binary"], state)
    if os.path.isdir(src):
        root = release_root(src)
    elif not os.path.isfile(src):
        raise NodeError(f"{shown(src)} does not exist on the node")
    elif binary is not None:
        return src, None, binary
    elif module.params["_packed"]:
        into = os.path.join(module.tmpdir, "release")
        os.mkdir(into)
        unpack_packed(src, into)
        root = release_root(into)
    else:
        raise NodeError(
            f"release archive {shown(src)} is not read: this node has no agent-fsm to read it with "
            f"(no `binary` given, none selected under {shown(state)}); give `binary`, or the release "
            "as a directory (a directory on the controller is copied as one)")
    return root, version_of(root), binary or find_binary(None, state, os.path.join(root, "bin", "agent-fsm"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            remote_src=dict(type="bool", default=False),
            config=dict(type="path"),
            binary=dict(type="path"),
            _packed=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    src = module.params["src"]
    config = config_path(module.params["config"])
    result = dict(changed=False, refused=False)
    try:
        if tomllib is None:
            raise NodeError("this node's python is older than 3.11 (no tomllib); agent-fsm needs 3.11")
        state = state_dir(config)
        given, version, binary = what_to_add(module, src, state)
        if version is not None:
            result.update(version=version, path=os.path.join(state, "releases", version))
        cli = Cli(module, binary, config)
        if module.check_mode:
            if version is None:
                result.update(changed=True, msg=f"release archive {shown(src)} would be stored "
                                                "(an archive is not read in check mode)")
                module.exit_json(**result)
            stored = any(r.get("version") == version for r in cli.releases())
            said = "is stored (content not compared in check mode)" if stored else "would be stored"
            result.update(changed=not stored, msg=f"release {version} {said}")
            module.exit_json(**result)
        rc, out, err = cli.run("release", "add", given)
    except NodeError as exc:
        module.fail_json(msg=str(exc), **result)
    if rc == EXIT_REFUSED:
        result["refused"] = True
        module.fail_json(msg=f"agent-fsm refused to store {version or shown(src)}: {last_line(err, out)}",
                         **result)
    if rc != EXIT_OK:
        module.fail_json(msg=f"agent-fsm release add failed (exit {rc}): {last_line(err, out)}", **result)
    if version is None:
        version = stored_version(out)
        if version is not None:
            result.update(version=version, path=os.path.join(state, "releases", version))
    result.update(changed="already stored" not in out, msg=last_line(out))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
