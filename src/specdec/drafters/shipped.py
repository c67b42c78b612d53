"""The draft heads shipped with the package, found for the loaded model.

Why: `--method eagle` or `--method medusa` on a fresh clone must work with no
download and no path; a head is matched to the loaded model by the fingerprint
of its token embedding that training wrote into the head's config.json, and to
the method by the layout's architecture name.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.models import LoadedModel
from specdec.proposers.eagle import HeadError, trained_for

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"


def find_shipped_head(loaded: LoadedModel, architecture: str, heads_dir: Path = HEADS_DIR) -> Path:
    """The shipped head folder of `architecture` trained for this model, or HeadError."""
    embedding = loaded.model.get_input_embeddings().weight
    for config in sorted(heads_dir.glob("*/config.json")):
        raw = json.loads(config.read_text())
        if architecture not in (raw.get("architectures") or []):
            continue
        theirs = (raw.get("specdec") or {}).get("target_fingerprint")
        if theirs is not None and trained_for(theirs, embedding):
            return config.parent
    arch = {"MedusaModel": "--arch medusa ", "HydraModel": "--arch hydra "}.get(architecture, "")
    raise HeadError(
        f"no {architecture} head ships for {loaded.name}: train one with `specdec train {arch}--data FILE -o DIR` "
        "and pass its folder as head=DIR"
    )
