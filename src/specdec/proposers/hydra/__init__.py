"""Hydra: Medusa's heads made sequentially dependent, each tree level guessed for its parent's prefix.

Modules: `head` (the heads, built on `specdec.proposers.medusa`'s), `proposer` (the `hydra`
method, `HydraConfig`, a Medusa proposer with other children).

Re-exported here: the head's names that other modules use. The proposer is not imported here:
the registry names it by module.
"""

from specdec.proposers.hydra.head import HydraHeads, hydra_loss, start_as_medusa

__all__ = ["HydraHeads", "hydra_loss", "start_as_medusa"]
