"""Fixtures: every test gets a real mock tool server process on fresh storage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mock_tool.client import ToolClient
from mock_tool.process import MockToolProcess


@pytest.fixture
def tool(tmp_path: Path) -> Iterator[MockToolProcess]:
    """A running server with the default tools; stopped (never leaked) afterwards."""
    with MockToolProcess(tmp_path / "tool-storage") as proc:
        yield proc


@pytest.fixture
def client(tool: MockToolProcess) -> ToolClient:
    return tool.client()
