"""specdec: lossless speculative decoding for Hugging Face causal language models.

    import specdec
    model = specdec.load_model()                      # the bundled SmolLM2-135M-Instruct
    out = specdec.generate(model, "Summarize: ...", method="logitspec", chat=True)
    print(out.text, out.stats.mat)
"""

from specdec.api import generate
from specdec.engine import Engine, GenerationConfig, GenerationOutput
from specdec.models import LoadedModel, ModelLoadError, load_model
from specdec.proposers import METHODS, parse_method
from specdec.sampling import SamplingParams
from specdec.tree import DraftTree

__version__ = "0.1.0"
__all__ = [
    "METHODS",
    "DraftTree",
    "Engine",
    "GenerationConfig",
    "GenerationOutput",
    "LoadedModel",
    "ModelLoadError",
    "SamplingParams",
    "generate",
    "load_model",
    "parse_method",
]
