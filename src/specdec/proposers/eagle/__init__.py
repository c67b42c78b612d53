"""EAGLE (EAGLE-2's dynamic tree, EAGLE-3's head): a trained head drafts from the target's own features.

Modules: `head` (the EAGLE-3 head, its checkpoint layout and the head-folder checks Medusa's
and Hydra's heads share), `retrieval` (retrieved continuations as extra branches of the tree),
`sampled` (trees drawn from the head's distribution at temperature > 0), `proposer` (the
`eagle` method, `EagleConfig`).

Re-exported here: the head's names that other modules use; `head` imports nothing of specdec's
proposers, so this cannot cycle. The proposer is not imported here (it imports
`specdec.drafters.shipped`, which imports this package): the registry names it by module.
"""

from specdec.proposers.eagle.head import (
    ARCHITECTURE,
    WEIGHTS_FILE,
    Eagle3Head,
    HeadError,
    default_layer_ids,
    head_config,
    read_head_folder,
    save_head,
    target_fingerprint,
    trained_for,
)

__all__ = [
    "ARCHITECTURE",
    "WEIGHTS_FILE",
    "Eagle3Head",
    "HeadError",
    "default_layer_ids",
    "head_config",
    "read_head_folder",
    "save_head",
    "target_fingerprint",
    "trained_for",
]
