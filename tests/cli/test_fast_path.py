"""What systemd runs (`daemon`, `recover`, `status --json`) starts without typer, rich or
pydantic, and behaves exactly as through the full command line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import pack
from agent_fsm.cli import fast_path
from tests.helpers import env_with_stub_systemctl, make_world

ROOT = Path(__file__).resolve().parents[2]
CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'
HEAVY = ("typer", "rich", "pydantic", "click")
# What the daemon does not need either, each a measured share of its resident memory: the package
# data readers (zipfile, importlib.resources), the release store's writers (tempfile, shutil with
# bz2 and lzma), OpenSSL (`_hashlib`, 3.5 MB, which filelock's `secrets` and `hmac` would map)
# and `ssl`; and what filelock loads only for its other locks, when first named: `asyncio` (its
# async locks, 5.7 MB with `ssl`) and `sqlite3` (its read-write lock, 0.9 MB). Not `secrets` nor
# `decimal` and `inspect`: filelock imports them (docs/benchmarks.md).
NOT_IN_THE_DAEMON = ("zipfile", "importlib.resources", "tempfile", "shutil", "_hashlib", "ssl",
                     "asyncio", "sqlite3")

# The console script's entry, reporting on exit which of those modules the run imported.
LEAN = ("import atexit, json, sys\n"
        "report = sys.argv.pop(1)\n"
        "atexit.register(lambda: open(report, 'w').write(json.dumps(sorted(\n"
        f"    m for m in {(*HEAVY, *NOT_IN_THE_DAEMON)!r} if m in sys.modules))))\n"
        "sys.argv[0] = 'agent-fsm'\n"
        "from agent_fsm.cli.entry import main\n"
        "main()\n")
FULL = ("import sys\n"
        "sys.argv[0] = 'agent-fsm'\n"
        "from agent_fsm.cli.app import main\n"
        "main()\n")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = env_with_stub_systemctl(tmp_path)
    env.pop("AGENT_FSM_CONFIG", None)
    env.update(extra)
    return env


def _start(code: str, args: list[str], env: dict[str, str],
           report: Path | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", code, *([str(report)] if report else []), *args]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _node(tmp_path: Path, setup: str) -> tuple[Path, Path]:
    """A node below tmp_path/root in the state `setup` names, and its config file."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(CONFIG)
    world = make_world(tmp_path / "root")
    if setup == "nothing installed":
        return cfg, world.root
    world.installed("1.0.0")
    if setup == "upgrading":
        world.upgrading("2.0.0")
    if setup == "ready":
        world.add_release("2.0.0")
    if setup == "bad config":
        cfg.write_text("name = 1\n")  # a wrong value (unknown keys the way back ignores)
    return cfg, world.root


def _twins(tmp_path: Path, setup: str) -> list[tuple[Path, list[str]]]:
    """Two identical nodes (one for each path) and the global options that name each."""
    out = []
    for side in ("lean", "full"):
        base = tmp_path / side
        base.mkdir()
        cfg, root = _node(base, setup)
        out.append((base, ["--config", str(cfg), f"--root={root}"]))
    return out


CASES = [
    (["recover"], "converged", 0),
    (["recover"], "upgrading", 0),
    (["daemon"], "bad config", 1),
    (["daemon"], "nothing installed", 1),
    (["upgrade", "--to", "2.0.0"], "ready", 0),
    (["upgrade", "--wait", "--to=2.0.0", "--timeout", "0.2"], "ready", 1),
    (["upgrade", "--to", "2.0.0"], "upgrading", 3),
    (["upgrade", "--to", "9.9.9"], "ready", 1),
]


@pytest.mark.parametrize(("command", "setup", "code"), CASES,
                         ids=[f"{' '.join(c)}: {s}" for c, s, _ in CASES])
def test_lean_and_full_paths_agree(tmp_path: Path, command: list[str], setup: str,
                                   code: int) -> None:
    """`recover`, `daemon`, `status --json` and `upgrade` print the same output and messages, exit
    with the same code and leave the node in the same state, whether or not the full CLI is
    built; the lean path imports none of typer, rich, pydantic, click."""
    (lean_dir, lean_opts), (full_dir, full_opts) = _twins(tmp_path, setup)
    report = tmp_path / "heavy.json"
    fast = _start(LEAN, [*lean_opts, *command], _env(tmp_path), report)
    full = _start(FULL, [*full_opts, *command], _env(tmp_path))
    results = []
    try:
        for proc, base in ((fast, lean_dir), (full, full_dir)):
            out, err = proc.communicate(timeout=60)
            state = base / "root" / "var/lib/agent-fsm/state.json"
            current = json.loads(state.read_text())["state"] if state.exists() else None
            out = re.sub(r"\+ *[0-9.]+s ", "+N s ", out)  # --wait's steps, timed from the start
            out = re.sub(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", "<time> ", out, flags=re.M)
            results.append((proc.returncode, out.replace(str(base), "<base>"),
                            err.replace(str(base), "<base>"), current))
    finally:  # one that did not end (a daemon that started after all) ends with the test
        for proc in (fast, full):
            proc.kill()
            proc.wait()
    assert results[0][0] == code, results[0]
    if command == ["status", "--json"]:  # the time and the seconds since move between the runs
        results = [(c, "".join(ln for ln in o.splitlines(True) if '"time"' not in ln
                               and "_seconds" not in ln), e, s) for c, o, e, s in results]
    assert results[0] == results[1]
    if code:
        err = results[0][2]  # one line says what went wrong (a warning logged before it aside)
        assert "Traceback" not in err and err.splitlines()[-1].startswith(("agent-fsm: ", "<3>"))
    assert set(json.loads(report.read_text())).isdisjoint(HEAVY)


def test_daemon_serves_and_stops_alike(tmp_path: Path) -> None:
    """The daemon started lean converges, opens the gate, logs the same lines and exits 0 on
    SIGTERM exactly as started through the full CLI, without loading typer, rich or pydantic,
    nor the standard modules only other commands need (NOT_IN_THE_DAEMON)."""
    report = tmp_path / "heavy.json"
    results = []
    for (base, opts), code in zip(_twins(tmp_path, "converged"), (LEAN, FULL), strict=True):
        proc = _start(code, [*opts, "daemon"], _env(tmp_path),
                      report if code is LEAN else None)
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("<6>ready:"):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        results.append((proc.returncode, out, ("".join(lines) + err).replace(str(base), "<base>")))
    assert results[0] == results[1]
    assert results[0][0] == 0 and "<6>ready: 1.0.0 running, gate open\n" in results[0][2]
    assert json.loads(report.read_text()) == []


def test_config_from_the_environment_on_the_lean_path(tmp_path: Path) -> None:
    """AGENT_FSM_CONFIG names the config for the lean path as for the full CLI."""
    runs = []
    for (base, opts), code in zip(_twins(tmp_path, "bad config"), (LEAN, FULL), strict=True):
        env = _env(tmp_path, AGENT_FSM_CONFIG=str(base / "config.toml"))
        proc = _start(code, [opts[2], "upgrade", "--to", "2.0.0"], env,
                      tmp_path / "heavy.json" if code is LEAN else None)
        out, err = proc.communicate(timeout=60)
        runs.append((proc.returncode, out, err.replace(str(base), "<base>")))
    assert runs[0] == runs[1] and runs[0][0] == 1 and "`name` is 1" in runs[0][2]


def test_a_refusal_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A refused `recover` (another operation holds the lock too long) exits 3 with the same
    one line on stderr on both paths."""
    from agent_fsm.actions import recover as recovering
    from agent_fsm.cli.app import app
    from agent_fsm.cli.exits import guarded
    from agent_fsm.errors import Refused

    def refuse(node: object, **_: object) -> None:
        raise Refused("another agent-fsm operation has held the lock for over 30s")

    monkeypatch.setattr(recovering, "recover", refuse)
    cfg, root = _node(tmp_path, "converged")
    argv = ["--config", str(cfg), "--root", str(root), "recover"]
    seen = []
    runs: tuple[Callable[[], int | None], ...] = (lambda: fast_path.main(argv),
                                                  lambda: guarded(lambda: app(argv)))
    for run in runs:
        code = run()
        seen.append((code, *capsys.readouterr()))
    assert seen[0] == seen[1] == (3, "", "agent-fsm: another agent-fsm operation has held the "
                                         "lock for over 30s\n")


def test_only_exact_shapes_are_lean() -> None:
    """Anything but `[--config F] [--root D] daemon|recover|status --json|upgrade --to V
    [--wait] [--timeout S]` goes to the full CLI, which owns help, usage errors and completion."""
    assert fast_path.parse(["daemon"]) is not None
    found = fast_path.parse(["--root", "/r", "--config=/c", "recover"])
    assert found is not None and (found[0].config, found[0].root) == (Path("/c"), Path("/r"))
    for argv in (["daemon", "--help"], ["recover", "now"], ["--root", "daemon"],
                 ["--root", "/r", "--root", "/s", "daemon"], ["--root=", "daemon"],
                 ["--version"], ["--verbose", "daemon"], ["status"], ["--", "daemon"], [],
                 ["upgrade"], ["upgrade", "--wait"], ["upgrade", "--to"], ["upgrade", "--to="],
                 ["upgrade", "--to", "--wait"], ["upgrade", "--to", "2", "--to", "3"],
                 ["upgrade", "--to", "2", "--wait", "--wait"], ["upgrade", "--to", "2", "--help"],
                 ["upgrade", "--to", "2", "--wait=1"], ["upgrade", "--to", "2", "--timeout", "0"],
                 ["upgrade", "--to", "2", "--timeout", "nan"], ["upgrade", "--to", "2",
                                                               "--timeout=inf"],
                 ["upgrade", "--to", "2", "--timeout", "-1"], ["upgrade", "--to", "2",
                                                               "--timeout", "soon"]):
        assert fast_path.parse(argv) is None, argv
    for argv in (["upgrade", "--to", "2"], ["upgrade", "--timeout=1e3", "--wait", "--to=2"]):
        assert fast_path.parse(argv) is not None, argv


def test_a_packed_release_runs_lean_without_its_heavy_libraries(tmp_path: Path) -> None:
    """A release's bin/agent-fsm (python -I -S -B, its own lib/) serves `recover` and
    `status --json` without importing typer, rich or pydantic: those are made to fail at import
    in the release's copy, and the lean commands still work while `--help` does not."""
    release = pack("1.0.0", tmp_path / "rel")
    for name in HEAVY:
        package = release / "lib" / name
        if package.is_dir():
            (package / "__init__.py").write_text(f"raise SystemExit('{name} was imported')\n")
    cfg, root = _node(tmp_path, "converged")
    agent_fsm = str(release / "bin" / "agent-fsm")
    env = _env(tmp_path)
    status = subprocess.run([agent_fsm, "--config", str(cfg), "--root", str(root), "status",
                             "--json"], capture_output=True, text=True, env=env, check=False)
    assert status.returncode == 0 and json.loads(status.stdout)["state"] == "converged", status
    recover = subprocess.run([agent_fsm, f"--config={cfg}", "--root", str(root), "recover"],
                             capture_output=True, text=True, env=env, check=False)
    assert (recover.returncode, recover.stdout) == (0, "nothing to roll back: no upgrade is "
                                                       "pending\n"), recover
    helped = subprocess.run([agent_fsm, "--help"], capture_output=True, text=True, env=env,
                            check=False)
    assert helped.returncode != 0 and "was imported" in helped.stderr
