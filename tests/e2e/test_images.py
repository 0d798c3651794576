"""Releases delivered as OCI images, end to end in a private systemd 252 with real podman and a
private image store: built, added, upgraded to, rolled back from, and pruned with their images."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from agent_fsm.actions.releases.images import CONTAINERFILE
from agent_fsm_lab.lab import BROKEN_ASSETS, RECOVERY_UNIT, UNIT, Lab
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = pytest.mark.e2e


def _podman_or_skip() -> str:
    """podman's path; skip without it (fail in CI: `make test` installs it as root)."""
    found = shutil.which("podman")
    if found is None:
        reason = "needs podman (`apt-get install podman`; `make test` installs it as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the e2e suite must not be skipped)", pytrace=False)
        pytest.skip(reason)
    return found


class Images:
    """The node's private podman store: the images under the sandbox's test directory, the run
    root in its private /run (podman takes one of at most 50 characters); never the host's."""

    def __init__(self, sandbox: SystemdSandbox, podman: str) -> None:
        self.sb = sandbox
        self.prefix = [podman, "--root", str(sandbox.test_dir / "podman"), "--runroot",
                       "/run/agent-fsm-e2e-podman", "--storage-driver", "overlay"]

    def run(self, *args: str) -> str:
        return self.sb.run(*self.prefix, *args, timeout=120).stdout

    def ids(self) -> set[str]:
        """Every image in the private store, as `podman images` lists it."""
        listed = self.run("images", "--all", "--quiet", "--no-trunc").split()
        return {"sha256:" + i.removeprefix("sha256:") for i in listed}

    def build(self, release: Path, tag: str | None = None) -> str:
        """Build a release image from a release directory as someone other than agent-fsm
        would: podman build of `FROM scratch` + `COPY`."""
        context = release.parent / f"{release.name}.context"
        shutil.copytree(release, context / "release", symlinks=True)
        (context / "Containerfile").write_text(CONTAINERFILE)
        named = ["--tag", tag] if tag else []
        out = self.run("build", "--quiet", "--file", str(context / "Containerfile"), *named,
                       str(context))
        return "sha256:" + out.split()[-1].removeprefix("sha256:")


def _why(lab: Lab) -> str:
    return lab.sb.diagnostics(UNIT, RECOVERY_UNIT)


def _added(lab: Lab, source: str) -> str:
    """`release add SOURCE`; the image id it printed."""
    proc = lab.cli("release", "add", source)
    first = proc.stdout.splitlines()[0]
    assert first.startswith("image sha256:"), proc.stdout
    return first.split()[1]


def test_releases_from_images_upgrade_roll_back_and_prune_their_images(
        systemd_sandbox: SystemdSandbox) -> None:
    """Releases packed as images and added from oci-archive: and containers-storage: install,
    upgrade (good) and roll back (broken) through real units; `release prune` then removes the
    images agent-fsm added for the releases it removes, keeps those its rule keeps, and never
    removes an image it did not add, all as `podman images` on the private store shows; a
    missing image or archive is one line, exit 1."""
    images = Images(systemd_sandbox, _podman_or_skip())
    lab = Lab(systemd_sandbox, deadline=4, soak=0, config_extra={"podman": images.prefix})
    health = lab.health
    workload = shlex.join(["/bin/sh", "-c", f'echo "$AGENT_FSM_VERSION" > {health}; '
                                            "exec sleep infinity"])
    # 1.0.0: packed by agent-fsm into an oci-archive (its directory kept too), then added.
    r1 = lab.dir / "r1.tar"
    lab.cli("release", "pack", "--version", "1.0.0", "--workload", workload,
            "--image", f"oci-archive:{r1}", "--output", str(lab.packs / "1.0.0"))
    assert images.ids() == set(), "packing into an archive leaves nothing in the store"
    image1 = _added(lab, f"oci-archive:{r1}")
    assert images.ids() == {image1}
    lab.install("1.0.0")

    # 2.0.0: packed by agent-fsm as an archive too, with a payload whose script is the
    # workload; a good upgrade (the script ran from the stored release's payload/).
    r2 = lab.dir / "r2.tar"
    agent = lab.dir / "agent" / "agent.sh"
    agent.parent.mkdir()
    agent.write_text(f'#!/bin/sh\necho "$AGENT_FSM_VERSION" > {health}\nexec sleep infinity\n')
    agent.chmod(0o755)
    lab.cli("release", "pack", "--version", "2.0.0", "--payload", str(agent.parent), "--workload",
            shlex.join(["/bin/sh", "-c", 'exec "$AGENT_FSM_RELEASE_DIR/payload/agent.sh"']),
            "--image", f"docker-archive:{r2}")
    image2 = _added(lab, f"docker-archive:{r2}")
    proc = lab.cli("upgrade", "--to", "2.0.0", "--wait", "--timeout", "60", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr + _why(lab)
    assert (lab.state_dir / "releases" / "2.0.0" / "payload" / "agent.sh").is_file()

    # 3.0.0: a crashing candidate in someone else's image, already in podman's store.
    tree = lab.packs / "3.0.0"
    shutil.copytree(lab.packs / "1.0.0", tree, symlinks=True)
    (tree / "release.toml").write_text((tree / "release.toml").read_text().replace("1.0.0", "3.0.0"))
    for name, text in BROKEN_ASSETS.items():
        (tree / "assets" / name).write_text(text)
    (tree / "bin" / "agent-fsm").write_text("#!/bin/sh\necho 'crashes at start' >&2\nexit 3\n")
    foreign = images.build(tree, tag="localhost/someone-else:3.0.0")
    assert _added(lab, "containers-storage:localhost/someone-else:3.0.0") == foreign
    assert images.ids() == {image1, image2, foreign}
    proc = lab.cli("upgrade", "--to", "3.0.0", "--wait", "--timeout", "60", check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr + _why(lab)
    assert lab.settled()["selected"] == "2.0.0"
    listed = lab.cli("release", "list").stdout.splitlines()
    assert any(line.startswith(f"  image {image1} (oci-archive:{r1}, manifest sha256:")
               for line in listed), listed

    # prune's own rule: 1.0.0 goes with its image; 3.0.0 (known bad: no coming upgrade) goes,
    # the image agent-fsm did not add stays; 2.0.0 (selected, last-good) stays with its own.
    out = lab.cli("release", "prune").stdout.splitlines()
    assert f"removed image {image1} of 1.0.0 (oci-archive:{r1})" in out, out
    assert f"kept image {image2} of 2.0.0 (selected, last-good)" in out, out
    assert "removed 3.0.0" in out and any(
        line.startswith(f"kept image {foreign} of 3.0.0 (not added by agent-fsm") for line in out)
    assert images.ids() == {image2, foreign}
    # Asked to keep none: the selected's release and image stay whatever is asked.
    out = lab.cli("release", "prune", "--keep", "0").stdout.splitlines()
    assert f"kept image {image2} of 2.0.0 (selected, last-good)" in out, out
    assert images.ids() == {image2, foreign}
    assert [line.split()[0] for line in lab.cli("release", "list").stdout.splitlines()] == [
        "2.0.0", "covers", "image"]

    for source, says in (("containers-storage:localhost/none:1", "is not in podman's store"),
                         (f"oci-archive:{lab.dir}/none.tar", "does not exist")):
        proc = lab.cli("release", "add", source, check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr
    assert lab.settled()["selected"] == "2.0.0"
