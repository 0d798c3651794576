"""The follow timer: `<name>-follow.timer` (the maintenance window as `OnCalendar=`, a random delay
so a fleet does not arrive at once) and the `<name>-follow.service` it starts. The service runs one
`agent-fsm follow` of the selected release through `selected`, as the agent unit does.

The running agent-fsm renders them from the config, not from a release's templates. They are not
held assets: the way back never runs through them. A follow is an operator's upgrade, refused while
one is pending or the gate is closed. So no candidate's version can break a rollback, and no
last-good copy is kept. Like `bin_link`, they are written at `install` and at each agent start once
the gate is open. They are removed when the config has no `[channel] url` (`upgrade.follow_timer`
does the systemd part). They hold no version, so they change only with the config.
"""

from __future__ import annotations

from ..channel_config import MAX_ROOTS
from ..config import Config
from ..paths import Paths
from ..quoting import unit_path, unit_token, unit_word
from .render import UNIT_MODE, Asset

# What one follow may take besides its fetches, download and awaited judgment: a recovery unit still
# at work from the last upgrade (45 s at most), the release's add, the record.
MARGIN_SECONDS = 300.0


def judgment_seconds(config: Config) -> float:
    """How long a follow waits for its upgrade's judgment: every attempt's deadline, soak and
    restart delay, and a margin for publishing the result."""
    j = config.judgment
    return (j.deadline_seconds + j.soak_seconds + j.restart_seconds) * j.max_attempts + 120.0


def follow_seconds(config: Config) -> int:
    """The most one whole follow takes (the service's `TimeoutStartSec=`). That is a fetch per root
    it may chain through and the index, the release's download, the judgment, and a margin."""
    ch = config.channel
    total = (MAX_ROOTS + 1) * ch.timeout_seconds + ch.download_seconds \
        + judgment_seconds(config) + MARGIN_SECONDS
    return int(total) + 1


def _seconds(value: float) -> str:
    return f"{value:.6f}".rstrip("0").rstrip(".")


def render(paths: Paths) -> tuple[Asset, Asset]:
    """The service and the timer for this node's config; ValueError, named by `quoting`, for a value
    a unit cannot hold."""
    config = paths.config
    name = unit_token(paths.name)
    selected = unit_path(str(paths.host_selected))
    service = (
        "# Written by agent-fsm from the config's [channel]: one follow of the signed channel.\n"
        "[Unit]\n"
        f"Description=Follow the signed channel of {name} (agent-fsm follow)\n"
        "After=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={selected}/bin/agent-fsm --config {unit_word(str(paths.host_config))} "
        "follow\n"
        "# Held (3) and rolled back (4) are follows that worked: the node is where it must be.\n"
        "SuccessExitStatus=3 4\n"
        "# The whole follow: its fetches, the download, the judgment of the upgrade it began.\n"
        f"TimeoutStartSec={follow_seconds(config)}\n"
    )
    timer = (
        "# Written by agent-fsm from the config's [channel]: the maintenance window.\n"
        "[Unit]\n"
        f"Description=Follow the signed channel of {name} in its maintenance window\n"
        "\n"
        "[Timer]\n"
        f"OnCalendar={config.channel.window}\n"
        f"RandomizedDelaySec={_seconds(config.channel.spread_seconds)}\n"
        "AccuracySec=1s\n"
        "# No Persistent=: a window missed while the node was off is not made up at boot.\n"
        "\n"
        "[Install]\n"
        "WantedBy=timers.target\n"
    )
    host = config.unit_dir
    return (Asset(host / paths.follow_service_name, paths.follow_service, UNIT_MODE,
                  service.encode()),
            Asset(host / paths.follow_timer_name, paths.follow_timer, UNIT_MODE, timer.encode()))
