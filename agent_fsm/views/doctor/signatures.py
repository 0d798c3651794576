"""`doctor`'s signature check: with `allowed_signers` set, every stored release's `release.sig`
verified again against that file as it is now.

The store's digest keeps a release as `release add` verified it, but the file can change: a key
removed, or past its `valid-before`. So doctor names each stored release no listed key signs now.
Selecting a release does not check its signature, since the way back must not depend on a listed
key. The fix: upgrade to a release a listed key signed, then prune the other.
"""

from __future__ import annotations

from ...errors import AgentFsmError, BadSignature, BadTree, CouldNotRun
from ...node.releases import signing
from ...system import sshsig
from ...wiring import Node
from .finding import Finding
from .modes import q

CHECK = "signature"


def signatures(node: Node) -> list[Finding]:
    """One finding per stored release no allowed signer signs now, or one `ok` naming who signed
    each. Nothing when the config requires no signature."""
    try:
        allowed = signing.allowed_signers(node.config, node.paths)
    except AgentFsmError:
        return []  # missing or not a file: `config_modes` reports it (`allowed signers`)
    if allowed is None:
        return []
    releases, out, good = node.releases, [], []
    for version in releases.versions():
        release = releases.path(version)
        fix = (f"select a release a key in {q(allowed)} signed (`agent-fsm upgrade`), then "
               f"`agent-fsm release prune {version}`")
        try:
            sig = signing.signature(release)
            if sig is None:
                out.append(Finding(CHECK, "warn", f"release {version} is not signed (stored "
                                   "before `allowed_signers` was set?): `release add` would "
                                   "refuse it now", fix))
                continue
            who = sshsig.verify(allowed, signing.NAMESPACE, sig,
                                signing.message(release, stored=True))
        except BadSignature as exc:
            out.append(Finding(CHECK, "fail", f"release {version}'s {signing.SIGNATURE} no longer "
                               f"verifies against {allowed}: {exc} (its key was taken out of the "
                               "file, or is past its valid-before)", fix))
            continue
        except CouldNotRun as exc:
            return [*out, Finding(CHECK, "fail", f"cannot verify signatures: {exc.reason}",
                                  "install OpenSSH's ssh-keygen (Debian: openssh-client)")]
        except (BadTree, ValueError, OSError) as exc:
            out.append(Finding(CHECK, "warn", f"release {version}'s signature not checked: "
                               f"{exc}", "`agent-fsm release list` says what is wrong with it"))
            continue
        good.append(f"{version} ({who})")
    if good or not out:
        out.append(Finding(CHECK, "ok", f"signed by a key in {allowed}: "
                           f"{', '.join(good) or 'no release stored yet'}"))
    return out
