"""Medusa (Medusa-1): heads on the target's last hidden state guess the next few tokens at once.

Modules: `head` (the heads, their loss and vLLM's checkpoint layout), `proposer` (the `medusa`
method, `MedusaConfig`; Hydra's proposer builds on it).

Re-exported here: the head's names that other modules use (Hydra's heads are Medusa's made
sequential). The proposer is not imported here: the registry names it by module.
"""

from specdec.proposers.medusa.head import (
    ARCHITECTURE,
    MedusaHeads,
    heads_loss,
    load_medusa,
    medusa_loss,
    save_medusa,
)

__all__ = ["ARCHITECTURE", "MedusaHeads", "heads_loss", "load_medusa", "medusa_loss", "save_medusa"]
