"""Shared test fixtures."""

import pytest

from specdec.engine import Engine
from specdec.models import load_model


@pytest.fixture(scope="session")
def default_model():
    """The bundled SmolLM2-135M-Instruct in float32, loaded once per session (converted once into ~/.cache/specdec)."""
    return load_model("smollm2-135m", dtype="fp32")


@pytest.fixture(scope="session")
def engine(default_model):
    """An Engine on the default model (each generate() starts from its own prefill)."""
    return Engine(default_model)
