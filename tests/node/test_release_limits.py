"""How big a release the store takes: ceilings from the host's config (`[store]`), with defaults
that take real agents."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm.actions.releases.packing import add
from agent_fsm.errors import ConfigError
from agent_fsm.node import config as config_mod
from agent_fsm.node.store_config import StoreConfig
from tests.helpers import World
from tests.node.test_release_store import make_release


class TestDefaultCeilings:
    def test_a_release_with_one_150_mb_file_is_stored(self, world: World, tmp_path: Path) -> None:
        """A 150 MB binary (sparse here: it costs no disk, and hashing it reads 150 MB) is
        stored under the default ceilings, byte for byte."""
        rel = make_release(tmp_path)
        (rel / "payload").mkdir()
        with open(rel / "payload" / "agent", "wb") as f:
            f.truncate(150_000_000)
            f.seek(150_000_000 - 4)
            f.write(b"end\n")
        added = add(rel, world.node)
        big = added.path / "payload" / "agent"
        assert big.stat().st_size == 150_000_000
        with open(big, "rb") as f:
            f.seek(150_000_000 - 4)
            assert f.read() == b"end\n"

    def test_a_release_of_20000_files_is_stored(self, world: World, tmp_path: Path) -> None:
        """A payload of 20,000 small files (a node_modules) is stored under the default
        ceilings, every file in it."""
        rel = make_release(tmp_path)
        for d in range(100):
            where = rel / "payload" / f"m{d}"
            where.mkdir(parents=True)
            for i in range(200):
                (where / f"f{i}.js").write_text(f"module.exports = {d * 200 + i};\n")
        added = add(rel, world.node)
        assert sum(1 for _ in (added.path / "payload").rglob("*.js")) == 20_000
        assert (added.path / "payload" / "m99" / "f199.js").read_text() == \
            "module.exports = 19999;\n"

    def test_the_defaults_take_a_4_gb_agent_of_500000_files(self) -> None:
        """The defaults hold an agent of 4 GB in 500,000 files beside agent-fsm's own."""
        limits = StoreConfig()
        assert limits.max_release_bytes >= 4_000_000_000 + (64 << 20)
        assert limits.max_file_bytes >= 4_000_000_000
        assert limits.max_release_files >= 500_000 + 2_000


class TestConfiguredCeilings:
    def test_the_store_table_is_read_from_the_config(self, tmp_path: Path) -> None:
        """`[store]` keys set the ceilings; the others keep their defaults."""
        cfg = tmp_path / "config.toml"
        cfg.write_text("[store]\nmax_file_bytes = 1048576\n")
        assert config_mod.load(cfg).store == StoreConfig(max_file_bytes=1 << 20)

    @pytest.mark.parametrize("value", ["0", "-1", "1.5", '"1G"', "true"])
    def test_a_ceiling_that_is_not_a_positive_integer_is_refused(self, tmp_path: Path,
                                                                 value: str) -> None:
        """A ceiling of 0, below it, fractional, a string or a boolean is refused at load,
        naming the key."""
        cfg = tmp_path / "config.toml"
        cfg.write_text(f"[store]\nmax_release_bytes = {value}\n")
        with pytest.raises(ConfigError, match=r"store\.max_release_bytes"):
            config_mod.load(cfg)
