from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import World, make_world


@pytest.fixture
def world(tmp_path: Path) -> World:
    """A fresh node below a temporary root: real files, fake systemctl, publisher and clock."""
    return make_world(tmp_path / "root")
