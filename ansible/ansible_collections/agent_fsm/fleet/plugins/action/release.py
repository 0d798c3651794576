# Copyright: agent-fsm contributors
# MIT License (see the LICENSE of agent-fsm)
"""The controller side of agent_fsm.fleet.release: copies the release to the node, then runs the module."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile

try:
    import tomllib
except ImportError:  # the controller's Python; check mode then copies the release like a real run
    tomllib = None

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

MODULE = "agent_fsm.fleet.release"


def _as_root(info):
    """A tar member owned by root: the node stores releases owned by root anyway."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


class ActionModule(ActionBase):

    TRANSFERS_FILES = True
    _VALID_ARGS = frozenset(("src", "remote_src", "config", "binary"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = dict(self._task.args)
        if not args.get("src"):
            raise AnsibleActionFail("src is required: a release directory or archive")
        try:
            if boolean(args.get("remote_src", False), strict=False):
                result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
                return result

            source = self._find_needle("files", args["src"])
            if self._task.check_mode:
                answer = self._check(source, args, task_vars)
                if answer is not None:
                    result.update(answer)
                    return result
            staging = tempfile.mkdtemp(prefix="agent-fsm-release-")
            try:
                if os.path.isdir(source):
                    # Not compressed: tarring ~1000 files is quick, compressing 20 MB is not (and
                    # an SSH connection may compress anyway).
                    archive = os.path.join(staging, "release.tar")
                    with tarfile.open(archive, "w") as tar:
                        tar.add(source, arcname="release", filter=_as_root)
                else:
                    archive = source
                name = "release.tar" if archive != source else os.path.basename(source)
                remote = self._connection._shell.join_path(self._connection._shell.tmpdir, name)
                self._transfer_file(archive, remote)
                self._fixup_perms2((self._connection._shell.tmpdir, remote))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            # The module unpacks an archive only if it is this tar of a directory (on a node with no
            # agent-fsm to read it): a user's archive is read by the node's agent-fsm alone.
            args.update(src=remote, remote_src=True, _packed=archive != source)
            result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _check(self, source, args, task_vars):
        """Check mode without copying: whether the node stores the release's version already,
        from agent_fsm.fleet.info; None when that cannot be told here (then copy and ask)."""
        if tomllib is None or not os.path.isdir(source):
            return None
        try:
            with open(os.path.join(source, "release.toml"), "rb") as handle:
                version = tomllib.load(handle).get("version")
        except (OSError, ValueError):
            return None
        if not isinstance(version, str):
            return None
        info_args = dict((k, args[k]) for k in ("config", "binary") if args.get(k))
        info = self._execute_module(module_name="agent_fsm.fleet.info",
                                    module_args=dict(info_args, history=1), task_vars=task_vars)
        if info.get("failed"):
            return info
        stored = version in (info.get("status") or {}).get("releases", [])
        said = "is stored (content not compared in check mode)" if stored else "would be stored"
        return dict(changed=not stored, refused=False, version=version,
                    path=os.path.join(info.get("state_dir", ""), "releases", version),
                    msg=f"release {version} {said}")
