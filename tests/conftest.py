"""Shared test helpers: the upstream fixtures in ../shared and small MiniMind builders."""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MINIMIND_SHARED", REPO_ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures" / "minimind-upstream"


def require_shared(path: Path) -> Path:
    """Return `path` under ../shared; fail under CI (CI=true) and skip elsewhere when it is missing."""
    if path.exists():
        return path
    message = f"{path} is missing (set MINIMIND_SHARED to the folder holding fixtures/)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    import torch

    torch.manual_seed(0)
    yield
