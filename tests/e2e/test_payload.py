"""Your agent's files in a release, end to end in a private systemd 252: packed with
`release pack --payload`, signed at pack or afterwards with `release sign`, added from a
.tar.gz under `allowed_signers`, run from the store as the release's workload; a payload file
changed after `add` is DAMAGED and refused, one changed after signing is refused at `add`."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent_fsm_lab.lab import Lab, output
from agent_fsm_lab.sandbox import SystemdSandbox

pytestmark = [pytest.mark.e2e]
if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark.append(pytest.mark.timeout(240))  # a safety net only: every wait here is bounded

NAMESPACE = "agent-fsm-release"
AGENT = """#!/bin/sh
# The user's agent {version}: it needs its data file, then says it is healthy as the lab's check
# reads it.
test "$(cat "$AGENT_FSM_RELEASE_DIR/payload/data/greeting")" = hello || exit 1
echo "$AGENT_FSM_VERSION" > {health}
exec sleep infinity
"""


def _keygen(key: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key.name, "-f",
                    str(key)], check=True, timeout=30)
    return key


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, output(proc)
    return lines[0]


def test_payload_signed_stored_damaged_and_refused(systemd_sandbox: SystemdSandbox) -> None:
    """A signed release with a payload is added from a .tar.gz and runs its payload as the
    workload; a payload file changed after add makes it DAMAGED (`release list`, `doctor`) and
    install, upgrade and activate refuse it until it is added again; an unsigned one is
    refused, then accepted once `release sign` signed it, and `release digest` is what
    ssh-keygen verifies; one whose payload changed after signing is refused at add."""
    work = systemd_sandbox.test_dir / "build"
    work.mkdir()
    key = _keygen(work / "release_ed25519")
    allowed = work / "allowed_signers"
    allowed.write_text(f'ops@example.com namespaces="{NAMESPACE}" '
                       f'{key.with_suffix(".pub").read_text()}')
    lab = Lab(systemd_sandbox, deadline=4, soak=1, config_extra={"allowed_signers": str(allowed)})
    src = work / "myagent"
    (src / "bin").mkdir(parents=True)
    (src / "data").mkdir()
    (src / "data" / "greeting").write_text("hello\n")
    workload = '/bin/sh -c \'exec "$AGENT_FSM_RELEASE_DIR/payload/bin/agent.sh"\''

    def pack(version: str, *signed: str) -> Path:
        """Pack `version` with the payload SRC, its script naming its version (so that no two
        releases hold the same bytes there)."""
        agent = src / "bin" / "agent.sh"
        agent.write_text(AGENT.format(version=version, health=lab.health))
        agent.chmod(0o750)
        out = lab.packs / version
        proc = lab.cli("release", "pack", "--version", version, "--output", str(out),
                       "--payload", str(src), "--workload", workload, *signed, check=False)
        assert proc.returncode == 0, output(proc)
        return out

    def listed() -> dict[str, dict[str, object]]:
        return {r["version"]: r for r in json.loads(lab.cli("release", "list", "--json").stdout)}

    # 1.0.0: signed at pack, shipped as a .tar.gz with one top directory, added from it.
    release = pack("1.0.0", "--sign-key", str(key))
    archive = work / "myagent-1.0.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(release, arcname="myagent-1.0.0")
    added = lab.cli("release", "add", str(archive))
    stored = lab.state_dir / "releases" / "1.0.0"
    assert (stored / "payload" / "bin" / "agent.sh").stat().st_mode & 0o777 == 0o755

    # Changed after add: DAMAGED, naming the file, and install refuses it.
    (stored / "payload" / "data" / "greeting").write_text("tampered\n")
    row = listed()["1.0.0"]
    assert row["intact"] is False and "payload/data/greeting changed content" in str(row["problem"])
    assert "DAMAGED" in lab.cli("release", "list").stdout
    refused = lab.cli("install", "--version", "1.0.0", check=False)
    assert refused.returncode == 1 and "payload/data/greeting" in _one_line(refused)
    assert lab.status()["selected"] is None

    # Added again, the damaged copy is replaced; installed, its payload runs as the workload.
    again = lab.cli("release", "add", str(archive))
    assert "it replaced the stored copy" in again.stdout, output(again)
    stored_digest, signed_digest = re.findall(r"sha256:[0-9a-f]{64}", added.stdout)
    assert stored_digest != signed_digest and stored_digest in again.stdout  # the same content
    assert lab.cli("release", "digest", str(release)).stdout.strip() == signed_digest
    lab.install("1.0.0")
    assert (lab.health).read_text() == "1.0.0\n"

    # 2.0.0 packed unsigned: refused; signed afterwards, its digest verifies by hand; stored.
    release = pack("2.0.0")
    refused = lab.cli("release", "add", str(release), check=False)
    assert refused.returncode == 3 and "not signed" in _one_line(refused)
    lab.cli("release", "sign", str(release), "--sign-key", str(key))
    digest = lab.cli("release", "digest", str(release)).stdout.strip()
    verify = lab.sb.run("sh", "-c", f"printf %s {shlex.quote(digest)} | ssh-keygen -Y verify "
                        f"-f {allowed} -I ops@example.com -n {NAMESPACE} "
                        f"-s {release / 'release.sig'}", check=False)
    assert verify.returncode == 0 and "Good" in verify.stdout + verify.stderr, output(verify)
    lab.cli("release", "add", str(release))

    # A payload file of the stored 2.0.0 changed: upgrade and activate refuse it, the node
    # stays on 1.0.0 with nothing pending.
    (lab.state_dir / "releases" / "2.0.0" / "payload" / "bin" / "agent.sh").write_text(
        "#!/bin/sh\nexit 0\n")
    for verb in (("upgrade", "--to", "2.0.0"), ("activate", "--to", "2.0.0")):
        refused = lab.cli(*verb, check=False)
        assert refused.returncode != 0 and "payload/bin/agent.sh" in _one_line(refused), verb
    end = lab.settled(timeout=20)
    assert (end["selected"], end["last_good"], end["signal"]) == ("1.0.0", "1.0.0", None)

    # 3.0.0 signed at pack, then a payload file changed: refused at add, nothing stored.
    release = pack("3.0.0", "--sign-key", str(key))
    (release / "payload" / "data" / "greeting").write_text("changed after signing\n")
    refused = lab.cli("release", "add", str(release), check=False)
    assert refused.returncode == 3 and "incorrect signature" in _one_line(refused)
    assert "3.0.0" not in listed()

    # The selected release damaged: doctor says which file.
    (stored / "payload" / "data" / "greeting").write_text("tampered again\n")
    doctor = lab.cli("doctor", check=False)
    assert "payload/data/greeting changed content" in doctor.stdout, output(doctor)
