"""Shared test fixtures."""

import pytest

from specdec.models import load_model


@pytest.fixture(scope="session")
def default_model():
    """The bundled SmolLM2-135M-Instruct in float32, loaded once per session (converted once into ~/.cache/specdec)."""
    return load_model("smollm2-135m", dtype="fp32")
