"""Hooks at transitions: `before` hooks may refuse what an operator starts, never the way back;
`after` hooks are told of every recorded transition and can never fail one."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest

from agent_fsm.errors import ConfigError, IllegalTransition, Refused, ReleaseError
from agent_fsm.machine.hooks import before_triggers
from agent_fsm.node import config as config_mod
from agent_fsm.node.hook_config import HookConfig
from agent_fsm.system.hooks import HookRunner
from agent_fsm.views.doctor.checks import doctor
from agent_fsm.views.status.report import status
from tests.helpers import DEFAULT_CONFIG, Crash, World, crash_at, make_world

SPY = """#!/bin/sh
# Records what it was given: its stdin and its AGENT_FSM_* environment, one file per run.
out={out}/$AGENT_FSM_HOOK.$AGENT_FSM_TRIGGER.$$
cat > "$out.json"
env | grep '^AGENT_FSM_' | sort > "$out.env"
cp {state} "$out.state" 2>/dev/null || true
"""


def script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text(body)
    path.chmod(mode)
    return path


def hooked(tmp_path: Path, before: dict[str, list[str]] | None = None,
           after: dict[str, list[str]] | None = None, timeout: float = 10.0) -> World:
    hooks = HookConfig(before={k: tuple(v) for k, v in (before or {}).items()},
                       after={k: tuple(v) for k, v in (after or {}).items()},
                       timeout_seconds=timeout)
    return make_world(tmp_path / "root", DEFAULT_CONFIG._replace(hooks=hooks))


def runner(world: World) -> HookRunner:
    hooks = world.node.controller.hooks
    assert isinstance(hooks, HookRunner)
    return hooks


def spy(tmp_path: Path) -> tuple[list[str], Path]:
    out = tmp_path / "seen"
    out.mkdir()
    state = tmp_path / "root" / "var/lib/agent-fsm/state.json"
    return [str(script(tmp_path / "spy.sh", SPY.format(out=out, state=state)))], out


def seen(out: Path) -> dict[str, tuple[dict[str, object], dict[str, str], dict[str, object]]]:
    """What each run of the spy was given, by `when.trigger`: JSON, environment, state file."""
    runs = {}
    for f in sorted(out.glob("*.json")):
        key = f.name.rsplit(".", 2)[0]
        assert key not in runs, f"{key} ran twice"
        env = dict(line.split("=", 1) for line in f.with_suffix(".env").read_text().splitlines())
        state = f.with_suffix(".state")
        runs[key] = (json.loads(f.read_text()), env,
                     json.loads(state.read_text()) if state.exists() else {})
    return runs


def untouched(world: World) -> dict[str, object]:
    """Everything a refused transition must leave as it was."""
    p = world.paths
    return {"state": p.state_file.read_bytes(), "assets": world.assets_on_disk(),
            "signal": p.signal_file.exists(), "selected": world.node.releases.selected(),
            "gate": world.node.gate.is_open(),
            # what was asked of systemd, a question (`show`: is the recovery unit at work?) aside
            "systemd": [call for call in world.systemd.calls if call[0] != "show"]}


class TestWhatHooksAreGiven:
    def test_hooks_get_the_transition_as_json_and_environment(self, tmp_path: Path) -> None:
        """A hook reads the transition on stdin (trigger, source, dest, versions, time; an
        after hook also its outcome) and the same as AGENT_FSM_* variables."""
        argv, out = spy(tmp_path)
        world = hooked(tmp_path, before={"begin_upgrade": argv}, after={"begin_upgrade": argv})
        world.installed("1.0.0").add_release("2.0.0")
        world.node.controller.fire("begin_upgrade", release="2.0.0")
        runner(world).wait()
        runs = seen(out)
        before, env, _ = runs["before.begin_upgrade"]
        assert {k: before[k] for k in ("name", "hook", "trigger", "source", "dest", "from", "to")} \
            == {"name": "agent", "hook": "before", "trigger": "begin_upgrade",
                "source": "converged", "dest": "candidate_running", "from": "1.0.0", "to": "2.0.0"}
        assert isinstance(before["time"], float)
        assert {k: env[f"AGENT_FSM_{k.upper()}"] for k in ("trigger", "source", "dest", "name")} \
            == {"trigger": "begin_upgrade", "source": "converged", "dest": "candidate_running",
                "name": "agent"}
        assert (env["AGENT_FSM_FROM"], env["AGENT_FSM_TO"]) == ("1.0.0", "2.0.0")
        after, env, _ = runs["after.begin_upgrade"]
        assert (after["hook"], after["outcome"], after["skipped"], after["result"]) == (
            "after", "ok", [], None)
        assert (env["AGENT_FSM_OUTCOME"], env["AGENT_FSM_RESULT"]) == ("ok", "")

    def test_an_after_hook_runs_once_the_transition_is_recorded(self, tmp_path: Path) -> None:
        """When an after hook runs, the state file already holds the transition's end state,
        with nothing owed."""
        argv, out = spy(tmp_path)
        world = hooked(tmp_path, after={"install": argv})
        world.add_release("1.0.0")
        world.node.controller.fire("install", release="1.0.0")
        runner(world).wait()
        _, _, state = seen(out)["after.install"]
        assert (state["state"], state["pending"]) == ("converged", None)

    def test_an_after_hook_is_told_the_outcome_of_a_rollback(self, tmp_path: Path) -> None:
        """`after.recover` learns that the upgrade's result is a rollback."""
        argv, out = spy(tmp_path)
        world = hooked(tmp_path, after={"recover": argv})
        world.installed("1.0.0").upgrading("2.0.0")
        world.node.controller.fire("recover")
        runner(world).wait()
        data, env, _ = seen(out)["after.recover"]
        assert (data["result"], data["from"], data["to"]) == ("rolled_back", "1.0.0", "2.0.0")
        assert env["AGENT_FSM_RESULT"] == "rolled_back"


class TestBeforeHooksRefuse:
    @pytest.mark.parametrize("body, mode, says", [
        ("#!/bin/sh\necho draining\necho 'node busy: 3 pods left' >&2\nexit 1\n", 0o755,
         "exited 1: node busy: 3 pods left"),
        ("#!/bin/sh\nsleep 30\n", 0o755, "did not finish within 0.5s"),
        ("#!/bin/sh\nexit 0\n", 0o644, "could not run: [Errno 13] Permission denied"),
    ], ids=["fails", "times-out", "not-executable"])
    def test_a_failing_before_hook_refuses_and_changes_nothing(
            self, tmp_path: Path, body: str, mode: int, says: str) -> None:
        """A before hook that fails, hangs past its timeout or cannot run refuses the upgrade
        (exit 3) with its last line, before anything is written: state file, assets, signal,
        selection, gate and systemd as they were."""
        hook = script(tmp_path / "drain.sh", body, mode)
        world = hooked(tmp_path, before={"begin_upgrade": [str(hook)]}, timeout=0.5)
        world.installed("1.0.0").add_release("2.0.0")
        before = untouched(world)
        started = time.monotonic()
        with pytest.raises(Refused) as refused:
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        assert time.monotonic() - started < 5  # the sleep's child is killed with the script
        assert refused.value.exit_code == 3
        assert str(refused.value).startswith("begin_upgrade refused by its before hook: hook "
                                             f"before.begin_upgrade ({hook}) ")
        assert says in str(refused.value)
        assert untouched(world) == before

    def test_a_refused_transition_runs_no_before_hook(self, tmp_path: Path) -> None:
        """A transition its conditions refuse does not run (and cannot drain for) its hook."""
        argv, out = spy(tmp_path)
        world = hooked(tmp_path, before={"begin_upgrade": argv})
        world.installed("1.0.0")
        with pytest.raises(ReleaseError, match=r"release 9\.9\.9 is not on this host"):
            world.node.controller.fire("begin_upgrade", release="9.9.9")
        assert seen(out) == {}

    def test_a_trigger_its_state_does_not_allow_runs_no_before_hook(self, tmp_path: Path) -> None:
        """`activate` on a node with nothing installed is refused as not allowed now, its
        conditions holding all the same, and its hook is never run."""
        argv, out = spy(tmp_path)
        world = hooked(tmp_path, before={"activate": argv})
        world.add_release("1.0.0")
        with pytest.raises(IllegalTransition, match=r"^can't activate now: nothing is installed"):
            world.node.controller.fire("activate", release="1.0.0")
        assert seen(out) == {}

    def test_a_before_hook_is_asked_after_an_interrupted_transition_resumes(
            self, tmp_path: Path) -> None:
        """When an interrupted transition is owed, the upgrade's before hook is still asked
        (once the owed effects are finished, under the lock) and its refusal holds."""
        hook = script(tmp_path / "drain.sh", "#!/bin/sh\necho 'not now' >&2\nexit 1\n")
        world = hooked(tmp_path, before={"begin_upgrade": [str(hook)]})
        world.installed("1.0.0").add_release("2.0.0")
        world.node.controller.failpoint = crash_at("settle", 1)
        with pytest.raises(Crash):
            world.node.controller.fire("settle")
        world.node.controller.failpoint = lambda _t, _k: None
        with pytest.raises(Refused, match="exited 1: not now"):
            world.node.controller.fire("begin_upgrade", release="2.0.0")
        doc = world.node.store.read()
        assert (doc.state, doc.pending, world.node.releases.selected()) == ("converged", None, "1.0.0")
        assert not world.paths.signal_file.exists()

    def test_the_way_back_runs_no_before_hook(self, tmp_path: Path) -> None:
        """Through an upgrade, a rollback and recovery, only install, activate and begin_upgrade
        run a before hook, even when one is given for every trigger past the config's check."""
        argv, out = spy(tmp_path)
        world = hooked(tmp_path)
        triggers = [t.trigger for t in world.node.definition.transitions]
        world.node.controller.hooks = HookRunner("agent", dict.fromkeys(triggers, argv), {}, 10)
        world.installed("1.0.0").add_release("1.1.0")
        world.node.controller.fire("activate", release="1.1.0")
        world.node.controller.fire("settle")
        world.upgrading("2.0.0")
        world.node.controller.fire("judge_failed")
        world.node.controller.fire("recover")
        world.node.controller.fire("recovered")
        assert world.node.store.read().state == "converged"
        assert sorted(seen(out)) == ["before.activate", "before.begin_upgrade", "before.install"]
        assert before_triggers(world.node.definition) == {"install", "activate", "begin_upgrade"}


class TestAfterHooksNeverFail:
    def test_a_failing_after_hook_is_logged_and_not_fatal(
            self, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
        """An after hook that fails is logged with its last line; the rollback it follows is
        recorded and the node converges all the same."""
        hook = script(tmp_path / "undrain.sh", "#!/bin/sh\necho 'cannot reach the API' >&2\nexit 7\n")
        world = hooked(tmp_path, after={"recover": [str(hook)], "recovered": [str(hook)]})
        world.installed("1.0.0").upgrading("2.0.0")
        with caplog.at_level(logging.ERROR, logger="agent_fsm"):
            world.node.controller.fire("recover")
            world.node.controller.fire("recovered")
            runner(world).wait()
        assert world.node.store.read().state == "converged"
        assert world.node.gate.is_open() and not world.paths.signal_file.exists()
        assert runner(world).failures == [
            f"hook after.{t} ({hook}) exited 7: cannot reach the API" for t in ("recover", "recovered")]
        assert "hook after.recovered" in caplog.text and "not fatal" in caplog.text

    def test_status_and_doctor_show_a_failed_after_hook_until_it_succeeds(self, tmp_path: Path) -> None:
        """`status` (and `doctor`, as a warning) keep an after hook's last failure, with its time
        and last line, until a later run of the same hook succeeds."""
        broken = tmp_path / "broken"
        broken.touch()
        hook = script(tmp_path / "undrain.sh",
                      f"#!/bin/sh\nif [ -e {broken} ]; then echo 'API down' >&2; exit 2; fi\n")
        world = hooked(tmp_path, after={"recovered": [str(hook)], "settle": [str(hook)]})
        world.installed("1.0.0").upgrading("2.0.0")
        world.node.controller.fire("recover")
        world.node.controller.fire("recovered")
        runner(world).wait()
        shown = {h["trigger"]: h["failed"] for h in status(world.node).to_json()["hooks"]}
        assert shown["recovered"] == {"time": world.clock.now(),
                                      "error": f"hook after.recovered ({hook}) exited 2: API down"}
        warned = [f for f in doctor(world.node, check_systemd=False) if f.check == "hook"]
        assert ("warn", f"after hook recovered last failed: hook after.recovered ({hook}) "
                "exited 2: API down") in [(f.level, f.detail) for f in warned]
        broken.unlink()
        world.node.controller.fire("settle")  # another hook's success clears nothing
        runner(world).wait()
        shown = {h["trigger"]: h["failed"] for h in status(world.node).hooks}
        assert shown["recovered"] is not None and shown["settle"] is None
        world.upgrading("3.0.0")
        world.node.controller.fire("recover")
        world.node.controller.fire("recovered")
        runner(world).wait()
        assert [h["failed"] for h in status(world.node).hooks] == [None, None]
        assert not [f for f in doctor(world.node, check_systemd=False) if f.check == "hook"]

    def test_a_hanging_after_hook_does_not_delay_the_way_back(self, tmp_path: Path) -> None:
        """An after hook runs beside the caller: `recover` returns, and the last-good's
        `recovered` converges, while the hook still runs."""
        go = tmp_path / "go"
        hook = script(tmp_path / "slow.sh", f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.02; done\n")
        world = hooked(tmp_path, after={"recover": [str(hook)]}, timeout=30)
        world.installed("1.0.0").upgrading("2.0.0")
        started = time.monotonic()
        world.node.controller.fire("recover")
        world.node.controller.fire("recovered")
        assert time.monotonic() - started < 10  # far below the hook's 30 s
        assert world.node.store.read().state == "converged"
        worker = runner(world)._worker
        assert worker is not None and worker.is_alive()  # the hook has not finished
        go.touch()
        runner(world).wait()
        assert runner(world).failures == []


class TestConfig:
    def load(self, tmp_path: Path, text: str) -> World:
        path = tmp_path / "config.toml"
        path.write_text(text)
        return make_world(tmp_path / "root", config_mod.load(path))

    def test_hooks_are_read_from_the_config_and_shown_by_status(self, tmp_path: Path) -> None:
        """`[hooks.before]`, `[hooks.after]` and `timeout_seconds` are read; status lists them."""
        world = self.load(tmp_path, '[hooks]\ntimeout_seconds = 5\n[hooks.before]\n'
                          'begin_upgrade = ["/usr/local/sbin/drain", "--wait"]\n[hooks.after]\n'
                          'recovered = ["/usr/local/sbin/undrain"]\n')
        assert world.node.config.hooks.timeout_seconds == 5.0
        assert status(world.node).to_json()["hooks"] == [
            {"when": "before", "trigger": "begin_upgrade",
             "argv": ["/usr/local/sbin/drain", "--wait"], "failed": None},
            {"when": "after", "trigger": "recovered", "argv": ["/usr/local/sbin/undrain"],
             "failed": None}]

    def test_an_unknown_trigger_is_a_config_error_listing_the_known(self, tmp_path: Path) -> None:
        """A hook for a trigger the machine lacks is refused, naming it and the known ones."""
        with pytest.raises(ConfigError, match=r"`hooks\.after\.upgrade` names no trigger of "
                           r"agent-upgrade; known triggers: install, activate, begin_upgrade, "):
            self.load(tmp_path, '[hooks.after]\nupgrade = ["/bin/true"]\n')

    def test_a_before_hook_for_the_way_back_is_a_config_error(self, tmp_path: Path) -> None:
        """No before hook may be configured for recover, recovered or anything the daemon
        fires: the config is refused, saying which triggers may have one."""
        for trigger in ("recover", "recovered", "orphaned_signal", "judge_failed", "settle",
                        "candidate_started", "judge_ok", "complete"):
            with pytest.raises(ConfigError, match=rf"`hooks\.before\.{trigger}` is not allowed.*"
                               r"may run for: activate, begin_upgrade, install"):
                self.load(tmp_path, f'[hooks.before]\n{trigger} = ["/bin/true"]\n')

    @pytest.mark.parametrize("text, says", [
        ('[hooks.before]\ninstall = ["drain"]\n', "the first an absolute path"),
        ('[hooks.before]\ninstall = []\n', "a non-empty list of strings"),
        ('[hooks]\ntimeout_seconds = 0\n', "above 0, at most 3600"),
        ('[hooks]\ntimeout_seconds = 7200\n', "above 0, at most 3600"),
        ('[hooks]\nbefor = {}\n', "unknown key `hooks.befor`"),
    ])
    def test_a_malformed_hook_is_a_config_error(self, tmp_path: Path, text: str, says: str) -> None:
        """A hook's argv and timeout are checked when the config is read."""
        with pytest.raises(ConfigError, match=says):
            self.load(tmp_path, text)
