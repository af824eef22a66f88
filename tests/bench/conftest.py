"""The bench tests' tiny model directory, saved once per test module."""

import pytest
from tiny_models import save_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
