"""The errors a user can cause, in a module that imports nothing heavy.

Why this module exists: the CLI turns these into one line on stderr, and it must
be able to name them without importing torch (so `specdec --help` stays fast).
"""


class SpecdecError(Exception):
    """A user-facing error: its message says what went wrong and what to do."""


class ModelLoadError(SpecdecError):
    """A model could not be loaded; the message says why and what to do."""


class UnsupportedModelError(ModelLoadError):
    """The model loads, but is not a causal LM that specdec can drive."""
