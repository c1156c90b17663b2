"""Shared fixtures: one plain and one speculative SmolLM2 model per session."""

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dspark_binary():
    """The `dspark` command of this checkout ($DSPARK, else build/dspark)."""
    for candidate in (os.environ.get("DSPARK"), ROOT / "build" / "dspark", shutil.which("dspark")):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    pytest.skip("no dspark binary: set DSPARK or run make cli")


@pytest.fixture(scope="session")
def spec_model():
    import dspark

    with dspark.Model("smollm2", drafter="auto", threads=2) as m:
        assert m.drafter is not None, "the shipped smollm2 drafter was not found"
        yield m


@pytest.fixture(scope="session")
def plain_model():
    import dspark

    with dspark.Model("smollm2", drafter=None, threads=2) as m:
        yield m


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        '{"id": "sky", "prompt": "Explain why the sky looks blue during the day."}\n'
        '{"id": "list", "prompt": "List three primary colors."}\n',
        encoding="utf-8",
    )
    return str(path)


def pytest_configure(config):
    # Tests import the installed package; examples/ scripts run with this interpreter.
    os.environ.setdefault("DSPARK_PYTHON", sys.executable)
