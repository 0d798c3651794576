"""Host values cannot inject into what agent-fsm renders or runs.

Two oracles that are not ours: systemd's own unit parser, and `sh`.

- systemd: `systemd-analyze verify --man=no` must accept the rendered units with nothing on
  stderr (a warning is a failure, see the sandbox notes); and the values must be the inputs as
  systemd parsed them. `verify` cannot show values, so the units are also loaded by systemd
  itself in test mode (`systemd --test --user`, as nobody: test mode refuses root), which dumps
  every loaded unit: each setting after unquoting and specifier expansion, an `ExecStart=`
  as its argv. That dump re-quotes each argument the shell's way (double quotes, `\\` before
  `"\\$` and the backquote); `_words` undoes only that. `$$` stays in the dump: systemd turns it
  into `$` when it executes the command (systemd.service(5), "COMMAND LINES").
- sh: the recovery script is run with a stub in place of the last-good binary that prints the
  argv it got, in an empty working directory that must stay empty.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm.errors import AssetError, ConfigError, ReleaseError
from agent_fsm.node import config
from agent_fsm.node.assets import render as assets
from agent_fsm.node.config import WEEK, Config, Judgment
from agent_fsm.node.paths import Paths
from agent_fsm.node.quoting import unit_path, unit_word
from agent_fsm.node.releases.pointers import check_version
from agent_fsm.node.state import validate
from agent_fsm.system.systemd import Systemctl
from tests.helpers import make_world

pytestmark = pytest.mark.xdist_group("injection-base")  # its module fixture is made once (Makefile)

ROOT = Path(__file__).resolve().parents[2]
ANALYZE = shutil.which("systemd-analyze")
MANAGER = next((p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd")
                if os.access(p, os.X_OK)), None)
needs_systemd = pytest.mark.skipif(
    ANALYZE is None or MANAGER is None,
    reason="needs systemd-analyze and the systemd binary (for `systemd --test`)")
STUB = "#!/bin/sh\nprintf '%s\\0' \"$0\" \"$@\"\n"  # prints the argv it was given, NUL-separated

# Characters a directory may have (`config._path`): odd but allowed, unicode included.
DIR_CHARS = "abcXYZ019%_-.+,:;=@!#&()*<>?[]^{}|~éüß中Ω😀"
# A config file's name may have anything but "/" and control characters.
FILE_CHARS = DIR_CHARS + " \"'\\$`\u00a0"
PAYLOADS = ["$(touch pwned)", "`touch pwned`", "x;touch pwned", "%n %% %i", "a\\", "\\\"",
            "'", "\"", "$$HOME", "${HOME}", "-x", ";", "\u00a0 \u00a0"]


# Generated hosts -----------------------------------------------------------------------------
def _part(chars: str) -> st.SearchStrategy[str]:
    return st.text(chars, min_size=1, max_size=6).filter(lambda p: p not in (".", ".."))


_dirs = st.lists(_part(DIR_CHARS), min_size=1, max_size=3).map("/".join)


@dataclass(frozen=True)
class Host:
    """One generated host: relative directory parts, a config file name, numbers at bounds."""

    name: str
    state: str
    lib: str
    units: str
    run: str
    config_name: str
    deadline: float
    soak: float
    attempts: int
    history: int
    restart: float


hosts = st.builds(
    Host,
    name=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,15}", fullmatch=True),
    state=_dirs, lib=_dirs, units=_dirs,
    run=st.lists(_part(DIR_CHARS.replace(":", "")), min_size=1, max_size=3).map("/".join),
    config_name=st.one_of(st.sampled_from(PAYLOADS), _part(FILE_CHARS)).map(lambda n: n + ".toml"),
    deadline=st.one_of(st.sampled_from([float(WEEK), 1e-9]),
                       st.floats(0, WEEK, exclude_min=True, allow_nan=False)),
    soak=st.one_of(st.sampled_from([0.0, float(WEEK)]), st.floats(0, WEEK, allow_nan=False)),
    attempts=st.one_of(st.sampled_from([1, 100]), st.integers(1, 100)),
    history=st.one_of(st.sampled_from([1, 100_000]), st.integers(1, 100_000)),
    restart=st.one_of(st.sampled_from([1.0, 3600.0, 1e-6]),
                      st.floats(0, 3600, exclude_min=True, allow_nan=False)),
)


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """A directory everyone may traverse (systemd's test mode runs as nobody), with a release
    holding the packaged templates and a runtime directory for the test-mode manager."""
    top = Path(tempfile.mkdtemp(prefix="agent-fsm-injection-"))
    top.chmod(0o755)
    templates = top / "release" / "assets"
    templates.mkdir(parents=True)
    for name in assets.TEMPLATES:
        (templates / name).write_text((resources.files("agent_fsm") / "templates" / name)
                                      .read_text())
    (top / "xdg").mkdir(mode=0o700)
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.chown(top / "xdg", nobody.pw_uid, nobody.pw_gid)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _load(base: Path, host: Host) -> tuple[Path, Config]:
    """Write the host's config file (TOML strings as JSON writes them) and load it."""
    ex = Path(tempfile.mkdtemp(dir=base))
    values = {"name": host.name, "state_dir": f"{ex}/s/{host.state}",
              "lib_dir": f"{ex}/l/{host.lib}", "unit_dir": f"{ex}/u/{host.units}",
              "run_dir": f"/run/{host.run}", "history_limit": host.history}
    judgment = {"deadline_seconds": host.deadline, "soak_seconds": host.soak,
                "max_attempts": host.attempts, "restart_seconds": host.restart}
    text = "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n" for k, v in values.items())
    text += "[judgment]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in judgment.items())
    source = ex / "c" / host.config_name
    _write(source, text)
    return ex, config.load(source)


def _render(base: Path, cfg: Config) -> dict[str, str]:
    """{template name: what it renders for this host}."""
    rendered = assets.render(base / "release", Paths(cfg), "1.0.0")
    return {t: a.content.decode() for t, a in zip(assets.TEMPLATES, rendered, strict=True)}


def _words(line: str) -> list[str]:
    """Split a `Command Line:` of systemd's dump: bare words, or double-quoted ones in which a
    backslash escapes one of `"\\$` and the backquote (systemd's shell quoting for display)."""
    out, i = [], 0
    while i < len(line):
        if line[i] == " ":
            i += 1
        elif line[i] == '"':
            word, i = [], i + 1
            while line[i] != '"':
                if line[i] == "\\":
                    assert line[i + 1] in '"\\$`', line
                    i += 1
                word.append(line[i])
                i += 1
            out.append("".join(word))
            i += 1
        else:
            end = line.find(" ", i)
            end = len(line) if end < 0 else end
            out.append(line[i:end])
            i = end
    return out


SPAN = {"y": 31557600, "M": 2629800, "w": 604800, "d": 86400, "h": 3600, "min": 60, "s": 1}


def _span(text: str) -> int:
    """Seconds of a systemd time span as the dump shows it ("2w 10s")."""
    total = 0
    for token in text.split():
        m = re.fullmatch(r"(\d+)(y|M|w|d|h|min|s)", token)
        assert m, text
        total += int(m[1]) * SPAN[m[2]]
    return total


def _dump(base: Path, probe: Path, unit: str) -> dict[str, dict[str, str]]:
    """Each loaded unit's settings as `systemd --test --user` parsed them: {unit: {key: value}}
    (the last value of a key; an ExecStart='s command line under `ExecStart`)."""
    nobody = pwd.getpwnam("nobody")
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                 "--clear-groups"]
    env = {"HOME": "/nonexistent", "XDG_RUNTIME_DIR": str(base / "xdg"),
           "SYSTEMD_UNIT_PATH": str(probe), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run([*(as_nobody if os.geteuid() == 0 else []), str(MANAGER), "--test",
                           "--user", f"--unit={unit}", "--no-pager"], capture_output=True,
                          text=True, env=env, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    units: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    command = ""  # the Exec*= whose command lines follow
    for line in proc.stdout.splitlines():
        if line.startswith("\t-> Unit "):
            current = units.setdefault(line[len("\t-> Unit "):].rstrip(":"), {})
        elif line.lstrip("\t").startswith("-> Exec"):
            command = line.lstrip("\t")[len("-> "):].rstrip(":")
        elif line.startswith("\t\t\tCommand Line: ") and command == "ExecStart":
            current["ExecStart"] = line.split(": ", 1)[1]
        elif line.startswith("\t\t") and ": " in line:
            key, _, value = line.strip("\t").partition(": ")
            current[key] = value
    return units


# Property tests --------------------------------------------------------------------------------
@needs_systemd
class TestUnitsAsSystemdParsesThem:
    @settings(max_examples=40, deadline=None)
    @given(host=hosts)
    def test_any_accepted_config_renders_units_systemd_reads_back_exactly(
            self, base: Path, host: Host) -> None:
        """Any accepted config renders units `systemd-analyze verify` takes without a word, whose
        values systemd parses back to the inputs."""
        ex, cfg = _load(base, host)
        paths = Paths(cfg)
        rendered = _render(base, cfg)
        probe = ex / "probe"
        agent, recovery = probe / paths.agent_unit_name, probe / paths.recovery_unit_name
        _write(agent, rendered["agent.service"])
        _write(recovery, rendered["recovery.service"])
        _write(probe / "basic.target", "[Unit]\nDescription=test mode needs one\n")
        _write(paths.host_selected / "bin" / "agent-fsm", STUB, 0o755)
        _write(paths.host_last_good / "bin" / "agent-fsm", STUB, 0o755)  # the start check's
        _write(paths.host_recovery_script, rendered["recovery.sh"], 0o755)
        for d, _, _ in os.walk(ex):
            Path(d).chmod(0o755)

        proc = subprocess.run([str(ANALYZE), "verify", "--man=no", str(agent), str(recovery)],
                              capture_output=True, text=True, timeout=30, check=False)
        assert (proc.returncode, proc.stderr) == (0, ""), rendered["agent.service"]

        units = _dump(base, probe, paths.agent_unit_name)
        got, back = units[paths.agent_unit_name], units[paths.recovery_unit_name]
        assert _words(got["ExecStart"]) == [
            str(paths.host_selected / "bin" / "agent-fsm"), "--config",
            str(cfg.source).replace("$", "$$"), "daemon"]
        assert got["ReadWritePaths"].split(" ") == [
            f"-{cfg.state_dir}", f"-{cfg.lib_dir}", f"-{cfg.unit_dir}"]
        assert got["RuntimeDirectory"] == str(cfg.run_dir.relative_to("/run"))
        assert got["OnFailure"] == f"{paths.recovery_unit_name} (origin-file)"
        assert got["Description"].startswith(f"{cfg.name} node agent ")
        assert _span(got["TimeoutStartSec"]) == int(host.deadline + host.soak + 10)
        assert _words(back["ExecStart"]) == [str(paths.host_recovery_script)]


class TestScriptAsShParsesIt:
    @settings(max_examples=80, deadline=None)
    @given(host=hosts)
    def test_any_accepted_path_survives_sh(self, base: Path, host: Host) -> None:
        """Any accepted config renders a recovery script that `sh -n` takes and that runs the
        last-good binary with exactly the config path, running nothing else."""
        ex, cfg = _load(base, host)
        paths = Paths(cfg)
        script = ex / "recovery.sh"
        _write(script, _render(base, cfg)["recovery.sh"], 0o755)
        _write(paths.host_last_good / "bin" / "agent-fsm", STUB, 0o755)
        cwd = ex / "cwd"
        cwd.mkdir()
        checked = subprocess.run(["sh", "-n", str(script)], capture_output=True, check=False)
        assert (checked.returncode, checked.stderr) == (0, b"")
        proc = subprocess.run(["sh", str(script)], capture_output=True, cwd=cwd, timeout=30,
                              check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.decode().split("\0")[:-1] == [
            str(paths.host_last_good / "bin" / "agent-fsm"), "--config", str(cfg.source),
            "recover"]
        assert list(cwd.iterdir()) == []


class TestAnyDirectoryText:
    @settings(max_examples=200, deadline=None)
    @given(value=st.text(max_size=12), key=st.sampled_from(["state_dir", "lib_dir", "unit_dir",
                                                            "run_dir", "name"]))
    def test_refused_in_one_line_or_rendered_line_for_line(self, base: Path, value: str,
                                                           key: str) -> None:
        """Any text for a directory or the name is refused in one line naming the key, or it
        renders every template line for line: no value adds a line."""
        text = value if key == "name" else ("/run/" if key == "run_dir" else "/srv/") + value
        try:
            cfg = config.parse({key: text}, Path("/etc/agent-fsm/config.toml"))
        except ConfigError as exc:
            assert f"`{key}` is " in str(exc) and len(str(exc).splitlines()) == 1
            return
        for template, content in _render(base, cfg).items():
            lines = (base / "release" / "assets" / template).read_text().count("\n")
            assert content.count("\n") == lines


# Each finding, plainly -------------------------------------------------------------------------
def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k != "AGENT_FSM_CONFIG"},
           "PATH": "/nonexistent", "COLUMNS": "200"}  # no systemctl can run, whatever happens
    return subprocess.run([sys.executable, "-m", "agent_fsm", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60, check=False)


def _one_line(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agent-fsm: "), proc.stderr
    return lines[0]


class TestVersions:
    def test_a_trailing_newline_is_no_version(self) -> None:
        """A version with a trailing newline is refused, by `release` and by the file readers."""
        for text in ("1.0.0\n", "1.0.0\r", "1.0.0\n\n"):
            with pytest.raises(ReleaseError):
                check_version(text)
            assert not validate._is_version(text)

    def test_pack_refuses_it_in_one_line(self, tmp_path: Path) -> None:
        """`release pack --version $'1.0.0\\n'` exits 1 with one line and writes nothing."""
        proc = _cli("release", "pack", "--version", "1.0.0\n", "--output", str(tmp_path / "r"))
        assert "'1.0.0\\n' is not a release version" in _one_line(proc, 1)
        assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("toml", "key", "shown"), [
    ('state_dir = "/var/lib/x\\n[Service]\\nExecStartPre=/bin/id"', "state_dir", "'/var/lib/x\\n"),
    ('lib_dir = "/usr/lib/a b"', "lib_dir", "'/usr/lib/a b'"),
    ('unit_dir = "/etc/$HOME"', "unit_dir", "'/etc/$HOME'"),
    ('run_dir = "/run/../var/lib/x"', "run_dir", "'/run/../var/lib/x'"),
    ('run_dir = "/run/a/./b"', "run_dir", "'/run/a/./b'"),
    ('state_dir = "//var/lib/x"', "state_dir", "'//var/lib/x'"),
    ('state_dir = "/var/lib/x/"', "state_dir", "'/var/lib/x/'"),
    ('state_dir = "/"', "state_dir", "'/'"),
    ('state_dir = "/var/\\u202elib"', "state_dir", "'/var/\\u202elib'"),
    ('run_dir = "/run/a:b"', "run_dir", "'/run/a:b'"),
    ('name = "-Hroot"', "name", "'-Hroot'"),
    ('name = ".agent"', "name", "'.agent'"),
    ('name = "a:b"', "name", "'a:b'"),
    ('name = "a\\\\x2d"', "name", "'a\\\\x2d'"),
    ('name = "agent\\n"', "name", "'agent\\n'"),
    (f'name = "{"a" * 129}"', "name", "'aaa"),
    ("[judgment]\ndeadline_seconds = nan", "judgment.deadline_seconds", "nan"),
    ("[judgment]\ndeadline_seconds = inf", "judgment.deadline_seconds", "inf"),
    ("[judgment]\nsoak_seconds = -inf", "judgment.soak_seconds", "-inf"),
    ("[judgment]\ndeadline_seconds = 1e308", "judgment.deadline_seconds", "1e+308"),
    ("[judgment]\ndeadline_seconds = 1e12", "judgment.deadline_seconds", "1000000000000.0"),
    ("[judgment]\nsoak_seconds = 604801", "judgment.soak_seconds", "604801"),
    ("[judgment]\ndeadline_seconds = 0", "judgment.deadline_seconds", "0"),
    ("[judgment]\nmax_attempts = 101", "judgment.max_attempts", "101"),
    ("[judgment]\nrestart_seconds = 0", "judgment.restart_seconds", "0"),
    ("[judgment]\nrestart_seconds = 3601", "judgment.restart_seconds", "3601"),
    ("[judgment]\nrestart_seconds = nan", "judgment.restart_seconds", "nan"),
    ('[judgment]\nrestart_seconds = "1s"', "judgment.restart_seconds", "'1s'"),
    ("[judgment]\nmax_attempts = 99999999999999999999", "judgment.max_attempts", "99999999999"),
    ("history_limit = 100001", "history_limit", "100001"),
])
def test_a_bad_config_value_is_refused_at_load_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        toml: str, key: str, shown: str) -> None:
    """A value that could inject or that systemd would ignore is refused by every command: exit 1,
    one line naming the key and the value, no traceback (the console script's own path, run in
    this process: a subprocess each would cost half a minute)."""
    from agent_fsm.cli.app import main

    cfg = tmp_path / "config.toml"
    cfg.write_text(toml + "\n")
    monkeypatch.delenv("AGENT_FSM_CONFIG", raising=False)
    monkeypatch.setattr(sys, "argv", ["agent-fsm", "--config", str(cfg), "--root",
                                      str(tmp_path / "root"), "status"])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    proc = subprocess.CompletedProcess(sys.argv, exited.value.code, "", err)
    assert f"`{key}` is {shown}" in _one_line(proc, 1)


def test_values_at_the_bounds_are_accepted(tmp_path: Path) -> None:
    """The documented bounds themselves load, and plain `status` works with them."""
    cfg = tmp_path / "config.toml"
    cfg.write_text("history_limit = 100000\n[judgment]\ndeadline_seconds = 604800\n"
                   "soak_seconds = 604800\nmax_attempts = 100\n")
    loaded = config.load(cfg)
    assert (loaded.history_limit, loaded.judgment.max_attempts) == (100_000, 100)
    proc = _cli("--config", str(cfg), "--root", str(tmp_path / "root"), "status")
    assert proc.returncode == 0, proc.stderr


class TestRendering:
    def test_config_path_is_one_quoted_word_in_the_script(self, base: Path) -> None:
        """A `--config` path with `$(…)` is single-quoted in the recovery script."""
        cfg = Config(name="agent", source=Path("/etc/x/$(touch pwned) 'a'.toml"))
        script = _render(base, cfg)["recovery.sh"]
        assert "--config '/etc/x/$(touch pwned) '\"'\"'a'\"'\"'.toml' recover" in script

    def test_config_path_is_one_quoted_argument_in_the_unit(self, base: Path) -> None:
        """In ExecStart= the config path is double-quoted, `\\` and `"` escaped, `%` and `$`
        doubled."""
        cfg = Config(name="agent", source=Path('/etc/%n $X "q"\\.toml'))
        unit = _render(base, cfg)["agent.service"]
        assert ' --config "/etc/%%n $$X \\"q\\"\\\\.toml" daemon\n' in unit

    def test_percent_in_a_path_setting_is_doubled(self, base: Path) -> None:
        """`%` in a directory is `%%` in ReadWritePaths= and RuntimeDirectory=."""
        cfg = Config(name="agent", state_dir=Path("/srv/a%b"), run_dir=Path("/run/x%i"))
        unit = _render(base, cfg)["agent.service"]
        assert "ReadWritePaths=-/srv/a%%b " in unit and "\nRuntimeDirectory=x%%i\n" in unit
        assert "ExecStart=/srv/a%%b/selected/bin/agent-fsm " in unit

    def test_what_a_unit_cannot_express_is_refused_at_render(self, base: Path) -> None:
        """A value that bypassed the config check (built in code) and cannot be written is an
        AssetError in one line naming the key, never a unit with an extra line."""
        for cfg, key in ((Config(state_dir=Path("/srv/a b")), "state_dir"),
                         (Config(lib_dir=Path("/srv/a\nExecStartPre=/bin/id")), "lib_dir"),
                         (Config(source=Path("/etc/a\nb.toml")), "config"),
                         (Config(name="a b"), "name")):
            with pytest.raises(AssetError, match=f"`{key}`") as caught:
                _render(base, cfg)
            assert len(str(caught.value).splitlines()) == 1

    def test_ordinary_values_render_as_before(self, base: Path) -> None:
        """Values that need no quoting are written as they are: existing units do not change."""
        assert unit_word("/etc/agent-fsm/config.toml") == "/etc/agent-fsm/config.toml"
        assert unit_path("/var/lib/agent-fsm") == "/var/lib/agent-fsm"
        unit = _render(base, Config())["agent.service"]
        assert ("ExecStart=/var/lib/agent-fsm/selected/bin/agent-fsm --config "
                "/etc/agent-fsm/config.toml daemon\n") in unit
        assert "\nRestartSec=1\n" in unit  # the default restart_seconds, as units had it

    @pytest.mark.parametrize(("seconds", "written"), [(0.25, "0.25"), (1e-6, "0.000001"),
                                                      (3600.0, "3600"), (2.5e-7, "0")])
    def test_restart_seconds_is_written_to_the_microsecond(self, base: Path, seconds: float,
                                                           written: str) -> None:
        """`[judgment] restart_seconds` is the agent unit's RestartSec=, in seconds to the
        microsecond systemd counts in (the property test above has systemd read them all)."""
        cfg = Config(name="agent", judgment=Judgment(restart_seconds=seconds))
        assert f"\nRestartSec={written}\n" in _render(base, cfg)["agent.service"]


class TestSystemctl:
    def test_unit_names_follow_a_double_dash(self, tmp_path: Path) -> None:
        """Every unit name reaches systemctl after `--`, so it can never be an option."""
        log = tmp_path / "argv"
        stub = tmp_path / "systemctl"
        _write(stub, f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {log}\n", 0o755)
        sd = Systemctl(str(stub))
        sd.reset_failed("-Hroot.service")
        sd.restart("-Hroot.service")
        sd.start("a.service")
        sd.enable("a.service")
        sd.daemon_reload()
        assert log.read_text().splitlines() == [
            "reset-failed -- -Hroot.service", "restart --no-block -- -Hroot.service",
            "start --no-block -- a.service", "enable -- a.service", "daemon-reload"]


CONFIG = 'name = "agent"\n[judgment]\ndeadline_seconds = 60\nsoak_seconds = 5\n'


class TestCliNumbers:
    @pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "0", "-inf"])
    def test_a_bad_timeout_is_a_usage_error_before_anything_starts(self, tmp_path: Path,
                                                                   timeout: str) -> None:
        """`upgrade --wait --timeout nan|inf|-1|0` exits 2 in one line and starts nothing."""
        world = make_world(tmp_path / "root").installed("1.0.0")
        world.add_release("2.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text(CONFIG)
        before = world.paths.state_file.read_bytes()
        proc = _cli("--config", str(cfg), "--root", str(world.root), "upgrade", "--to", "2.0.0",
                    "--wait", "--timeout", timeout)
        assert "--timeout" in _one_line(proc, 2) and "nothing was started" in proc.stderr
        assert world.paths.state_file.read_bytes() == before
        assert not world.paths.signal_file.exists()


class TestMetricsOutput:
    def _world(self, tmp_path: Path) -> tuple[Path, Path]:
        world = make_world(tmp_path / "root").installed("1.0.0")
        cfg = tmp_path / "config.toml"
        cfg.write_text(CONFIG)
        return world.root, cfg

    @pytest.mark.parametrize("where", ["var/lib/agent-fsm/state.json",
                                       "var/lib/agent-fsm/state.prom",
                                       "var/lib/agent-fsm/releases/x.prom",
                                       "etc/systemd/system/agent.prom",
                                       "usr/local/lib/agent-fsm/m.prom",
                                       "run/agent-fsm/m.prom"])
    def test_never_inside_agent_fsm_dirs(self, tmp_path: Path, where: str) -> None:
        """--output inside the state, lib, unit or run dir (or not *.prom) is refused: exit 2, one
        line, the state untouched."""
        root, cfg = self._world(tmp_path)
        state = root / "var/lib/agent-fsm/state.json"
        before = state.read_bytes()
        proc = _cli("--config", str(cfg), "--root", str(root), "metrics", "--output",
                    str(root / where))
        assert "refusing --output" in _one_line(proc, 2)
        assert state.read_bytes() == before
        assert where.endswith("state.json") or not (root / where).exists()

    def test_not_through_a_symlink_into_them(self, tmp_path: Path) -> None:
        """A collector directory that is a symlink into the state dir is refused all the same."""
        root, cfg = self._world(tmp_path)
        (tmp_path / "collector").symlink_to(root / "var/lib/agent-fsm")
        proc = _cli("--config", str(cfg), "--root", str(root), "metrics", "--output",
                    str(tmp_path / "collector" / "m.prom"))
        assert "state_dir" in _one_line(proc, 2)

    def test_a_prom_file_elsewhere_is_written(self, tmp_path: Path) -> None:
        """A *.prom file outside them is written as before."""
        root, cfg = self._world(tmp_path)
        proc = _cli("--config", str(cfg), "--root", str(root), "metrics", "--output",
                    str(tmp_path / "textfile" / "agent-fsm.prom"))
        assert proc.returncode == 0, proc.stderr
        assert "agent_fsm_state" in (tmp_path / "textfile" / "agent-fsm.prom").read_text()
