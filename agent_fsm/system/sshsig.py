"""OpenSSH signatures: signing a message and verifying it against an allowed-signers file, with
`ssh-keygen -Y sign`, `-Y find-principals` and `-Y verify` (ssh-keygen(1), "ALLOWED SIGNERS").

agent-fsm does no cryptography of its own: every signature is made and checked by ssh-keygen.
"""

from __future__ import annotations

from pathlib import Path

from .. import files
from ..errors import BadSignature
from . import proc

SSH_KEYGEN = "ssh-keygen"
SIGN_TIMEOUT = 120.0  # a key in a hardware token waits for a touch
VERIFY_TIMEOUT = 30.0


def sign(key: Path, namespace: str, message: bytes) -> bytes:
    """The armored signature of `message` by `key`: a private key file, or a public one whose
    private half is in ssh-agent. ssh-keygen asks for a passphrase on the terminal. BadSignature
    when ssh-keygen refuses; CouldNotRun."""
    with files.private_dir(prefix="agent-fsm-sign.") as tmp:
        data = tmp / "message"
        data.write_bytes(message)
        done = proc.run([SSH_KEYGEN, "-q", "-Y", "sign", "-f", str(key), "-n", namespace,
                         str(data)], timeout=SIGN_TIMEOUT)
        signature = data.with_name("message.sig")
        if done.returncode != 0 or not signature.is_file():
            raise BadSignature(done.tail or f"ssh-keygen exited {done.returncode}")
        return signature.read_bytes()


def verify(allowed_signers: Path, namespace: str, signature: Path, message: bytes) -> str:
    """The principal of `allowed_signers` whose key made `signature` over `message` in `namespace`.
    BadSignature when no key there made it or it does not verify (the message changed, another
    namespace, a key outside its validity); CouldNotRun."""
    found = proc.run([SSH_KEYGEN, "-Y", "find-principals", "-s", str(signature),
                      "-f", str(allowed_signers)], timeout=VERIFY_TIMEOUT)
    principals = found.stdout.split()
    if found.returncode != 0 or not principals:
        raise BadSignature("no key in the file made it (" + (found.tail or "no principal") + ")")
    # The same key may be listed for several principals: verifying as the first one checks it.
    done = proc.run([SSH_KEYGEN, "-Y", "verify", "-f", str(allowed_signers), "-I", principals[0],
                     "-n", namespace, "-s", str(signature)],
                    timeout=VERIFY_TIMEOUT, stdin=message.decode("ascii"))
    if done.returncode != 0:
        raise BadSignature(done.tail or f"ssh-keygen exited {done.returncode}")
    return principals[0]
