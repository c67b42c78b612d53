"""Held-out top-1 accuracy of draft heads on one feature cache's last rows: heads trained on different data
scored on the same text.

Why: `specdec-hf train` reports accuracy on the last share of its own `--data`, so heads trained on
different files are scored on different rows. This scores each head folder on the last `--last` examples
of one cache (`specdec-hf train --cache`), the target's greedy token as the answer, as training does.

    .venv/bin/python benchmarks/head_accuracy.py --cache FEATURES --last 66 HEAD_FOLDER [HEAD_FOLDER ...]

The cache must hold the features the heads read (Medusa and Hydra: the target's last hidden state; EAGLE-3:
its three layers), for the bundled model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.drafters.features import load_cache
from specdec.drafters.train import TrainConfig, evaluate
from specdec.models import load_model
from specdec.proposers.eagle.head import load_head
from specdec.proposers.hydra import HydraHeads
from specdec.proposers.medusa import MedusaHeads, load_medusa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heads", nargs="+", type=Path)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--last", type=int, default=66, help="examples at the cache's end to score on")
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args()
    loaded = load_model(args.model)
    examples = load_cache(args.cache)[-args.last :]
    for folder in args.heads:
        arch = json.loads((folder / "config.json").read_text()).get("model_type")
        arch = arch if arch in ("medusa", "hydra") else "eagle3"
        if arch == "eagle3":
            head = load_head(folder, loaded.model, torch.float32)
            vocab = head.d2t + torch.arange(head.d2t.numel())  # EAGLE-3's offsets -> target ids
        else:
            kinds = {"hydra": HydraHeads, "medusa": MedusaHeads}
            head = load_medusa(folder, loaded.model, torch.float32, kind=kinds[arch])
            vocab = head.token_map
        to_draft = torch.full((loaded.model.config.vocab_size,), -100, dtype=torch.int64)
        to_draft[vocab] = torch.arange(vocab.numel())
        config = TrainConfig(data="-", out="-", arch=arch)
        accuracy = evaluate(head.train(), examples, config, to_draft)
        print(json.dumps({"head": str(folder), "examples": len(examples), "top1": [round(a, 3) for a in accuracy]}))


if __name__ == "__main__":
    main()
