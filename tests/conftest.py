"""Shared test fixtures.

Real data lives in `../shared/data` beside the repository (GSM8K, Knights-and-Knaves). A user's fresh clone does not
have it, so tests that need it take the `shared_data` fixture and are skipped with the reason when it is absent.
"""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED_DATA = pathlib.Path(os.environ.get("PADDLE_GRPO_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data():
    """Path of ../shared/data; skips the test when the directory is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (only present beside the project's own checkout; "
                    "set PADDLE_GRPO_SHARED_DATA to point elsewhere)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def repo_root():
    return REPO
