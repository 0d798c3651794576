"""The host's `[store]` table: the ceilings of one release the store takes, each a key the
operator raises for a bigger agent. The defaults take an agent of 4 GB in 500,000 files beside
agent-fsm's own (~1,000 files). A tree is refused at the first file or byte over a ceiling,
naming the key. The hostile-archive bounds (`tarstream`) and the nesting depth stay fixed."""

from __future__ import annotations

from typing import NamedTuple


class StoreConfig(NamedTuple):
    """How big one release may be: all its files' bytes, its files and directories, one file."""

    max_release_bytes: int = 16 << 30
    max_release_files: int = 1_000_000
    max_file_bytes: int = 8 << 30


DEFAULTS = StoreConfig()  # a build machine's, packing without a host config
CEILING = 1 << 50  # a PiB: above any disk a node has


def raise_key(key: str) -> str:
    """What to do about a ceiling: the key that raises it."""
    return f"the store's limit: raise `[store] {key}` in the host config to take it"


def size_text(size: int) -> str:
    """Bytes in the binary unit a person reads: `800 MiB`, `1.2 GiB`, `512 bytes`."""
    if size < 1024:
        return f"{size} bytes"
    value, units = size / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]}".replace(".0 ", " ")
