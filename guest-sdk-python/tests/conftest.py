"""Shared fixtures: the repository's shared test vectors."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: The repository root (this SDK lives in `guest-sdk-python/`).
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def shared_vectors() -> Callable[[str], Any]:
    """Reads a vector file of `core/tests/`, the same file the host's tests
    read (`WAKU_VECTORS_DIR` points elsewhere, for a copy of the SDK outside
    the repository)."""

    def read(name: str) -> Any:
        directory = Path(os.environ.get("WAKU_VECTORS_DIR", REPO / "core" / "tests"))
        return json.loads((directory / name).read_text(encoding="utf-8"))

    return read
