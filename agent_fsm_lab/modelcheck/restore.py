"""The state dir put back as it was, between two processes: a fault the field sees that no
process step makes, as the clock step is (`search.Checker._expand`).

While an upgrade's signal exists and the state file knows it, the state file is replaced by an
earlier one, the node's as it was in the initial configuration (installed on the first release,
converged, the gate open):

- `restore state.json`: a backup tool restores `<state_dir>/state.json` from last night; the rest
  of the state dir (the journal, the pointers, the known-bad marks, the signal) stays as it is;
- `restore state-dir`: a config-management tool puts the whole state dir back as it was (the
  pointers `selected` and `last-good`, the journal, the known-bad marks, the kept assets, the
  releases), all but the upgrade signal, which it does not manage;
- `restore lost`: the state file is lost (a damaged file system, fsck took it): it reads as the
  initial state, `idle`.

Each leaves a signal the state file does not know: `orphaned_signal`'s way back.
"""

from __future__ import annotations

from collections.abc import Iterator

from .tree import Tree

HOW = ("state.json", "state-dir", "lost")
WHO = {
    "state.json": "a backup tool restores state.json from last night",
    "state-dir": "a config-management tool restores the state dir but the signal",
    "lost": "the file system loses state.json",
}


def restored(now: Tree, initial: Tree, state_dir: str, state_file: str,
             signal_file: str) -> Iterator[tuple[str, Tree]]:
    """Each way the state file (and what travels with it) goes back to `initial`'s: (how, the
    files after it), the ones that differ from `now` only. Paths relative to the root."""
    inside = state_dir + "/"
    then = {e[0]: e for e in initial.entries}
    for how in HOW:
        if how == "state.json":
            entries = [e for e in now.entries if e[0] != state_file]
            if state_file in then:
                entries.append(then[state_file])
        elif how == "state-dir":
            entries = [e for e in now.entries if not e[0].startswith(inside) or e[0] == signal_file]
            entries += [e for e in initial.entries if e[0].startswith(inside) and e[0] != signal_file]
        else:
            entries = [e for e in now.entries if e[0] != state_file]
        tree = Tree(tuple(sorted(entries)))
        if tree.entries != now.entries:
            yield how, tree
