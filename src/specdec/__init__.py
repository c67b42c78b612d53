"""specdec: lossless speculative decoding for Hugging Face causal language models.

    import specdec
    model = specdec.load_model()                      # the bundled SmolLM2-135M-Instruct
    out = specdec.generate(model, "Summarize: ...", method="logitspec", chat=True)
    print(out.text, out.stats.mat)

The public names are imported lazily (PEP 562), so `import specdec` and
`specdec --help` answer without importing torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "generate": "specdec.api",
    "decoder": "specdec.integrations.transformers_generate",
    "Engine": "specdec.engine.loop",
    "GenerationConfig": "specdec.engine.loop",
    "GenerationOutput": "specdec.engine.loop",
    "LoadedModel": "specdec.models",
    "ModelLoadError": "specdec.models",
    "ModelSpec": "specdec.choices",
    "load_model": "specdec.backends.registry",
    "METHODS": "specdec.proposers",
    "parse_method": "specdec.proposers",
    "SamplingParams": "specdec.sampling",
    "DraftTree": "specdec.tree",
}
__all__ = [
    "METHODS",
    "DraftTree",
    "Engine",
    "GenerationConfig",
    "GenerationOutput",
    "LoadedModel",
    "ModelLoadError",
    "ModelSpec",
    "SamplingParams",
    "decoder",
    "generate",
    "load_model",
    "parse_method",
]

if TYPE_CHECKING:
    from specdec.api import generate
    from specdec.backends.registry import load_model
    from specdec.choices import ModelSpec
    from specdec.engine.generation import GenerationConfig, GenerationOutput
    from specdec.engine.loop import Engine
    from specdec.integrations.transformers_generate import decoder
    from specdec.models import LoadedModel, ModelLoadError
    from specdec.proposers import METHODS, parse_method
    from specdec.sampling import SamplingParams
    from specdec.tree import DraftTree


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
