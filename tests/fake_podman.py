"""A fake `podman` for unit tests: a process, run as the config's `podman` prefix
`[python, this file, STATE]`, keeping its image store in the JSON file STATE.

STATE: {"images": {hex id: {"names": [...], "tree": dir}}, "calls": [argv...], "fail": {verb:
message}, "busy": [hex ids rmi refuses]}. An archive (`oci-archive:FILE`) is a JSON file
{"id": hex, "tree": dir}: pulling it puts that image in the store; mounting an image prints its
tree, a directory the test prepared.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main(state_path: Path, argv: list[str]) -> int:
    state: dict[str, Any] = json.loads(state_path.read_text())
    state["calls"].append(argv)
    images: dict[str, Any] = state["images"]
    words = [a for a in argv if a != "--"]
    verb = " ".join(words[:2]) if words[0] == "image" else words[0]

    def save() -> None:
        state_path.write_text(json.dumps(state))

    def find(ref: str) -> str | None:
        ref = ref.removeprefix("sha256:")
        return next((i for i, img in images.items() if ref == i or ref in img["names"]), None)

    save()
    if verb in state["fail"]:
        print(f"Error: {state['fail'][verb]}", file=sys.stderr)
        return 125
    if verb == "images":
        print("\n".join(images))
        return 0
    if verb == "image exists":
        return 0 if find(words[-1]) else 1
    if verb == "image inspect":
        found = find(words[-1])
        if found is None:
            print(f"Error: {words[-1]}: image not known", file=sys.stderr)
            return 125
        print(f"{found} sha256:{found[::-1]}")  # the id and a manifest digest
        return 0
    if verb == "pull":
        ref = words[-1]
        path = Path(ref.split(":", 1)[1])
        if not path.is_file():
            print(f"Error: open {path}: no such file or directory", file=sys.stderr)
            return 125
        archive = json.loads(path.read_text())
        if "--quiet" not in words:  # what podman 4 says of a pull, on stderr, as it goes
            for line in ("Getting image source signatures", f"Copying blob sha256:{archive['id']}",
                         "Writing manifest to image destination", "Storing signatures"):
                print(line, file=sys.stderr, flush=True)
        images.setdefault(archive["id"], {"names": [], "tree": archive["tree"]})
        save()
        print(archive["id"])
        return 0
    if verb in ("image mount", "image unmount", "rmi"):
        found = find(words[-1])
        if found is None:
            print(f"Error: {words[-1]}: image not known", file=sys.stderr)
            return 125
        if verb == "image mount":
            print(images[found]["tree"])
        elif verb == "rmi":
            if found in state["busy"]:
                print(f"Error: image used by a container: {found}", file=sys.stderr)
                return 2
            del images[found]
            save()
        return 0
    print(f"Error: fake podman does not know {argv}", file=sys.stderr)
    return 125


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
