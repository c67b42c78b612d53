"""Whether the server verifies exactly (batch-invariantly): on by default wherever the model's path can.

Why: a server is where users notice first that one request gives different
text from run to run. With bf16 verification that is not batch-invariant, a
row's logits depend on how many rows and tree nodes share its pass, so near-tie
argmaxes flip: the same greedy request, or the same seed, gave different text
alone and in a batch. `exact on` (`LoadedModel.exact`,
`specdec.backends.torch.invariant`) makes each row's arithmetic independent of
the batch, at some tokens/s, so the server turns it on unless told `off`.

The option is the model's own (`ModelSpec.exact`, `--exact`), declared once;
only its "auto" reads more strongly here. Elsewhere "auto" means on where it
costs nothing (`specdec.choices.EXACT`); a server is on wherever it can, even
where that costs tokens/s. This module is where that reading is applied.

Invariants:
- "auto" (the default) gives exact verification wherever the loaded model's
  path supports it (a backend that can, and for torch: bf16 / fp16 on a CPU
  with packed weights), else leaves it off; it never fails for that;
- "on" fails at startup (ValueError naming why) where the path cannot;
  "off" is always off;
- the decision is made once, before anything measures or runs the model, and
  is stated in one line for the start-up log.
"""

from __future__ import annotations

import dataclasses

from specdec.backends.registry import verifies_exactly
from specdec.choices import BACKENDS, check_exact
from specdec.models import LoadedModel


def why_not_exact(loaded: LoadedModel) -> str | None:
    """Why `loaded` cannot verify batch-invariantly, or None where it can."""
    backend = BACKENDS[loaded.backend]
    if not backend.exact:
        return f"backend {loaded.backend!r} cannot verify batch-invariantly"
    if backend.gguf:  # its engine holds exactness itself (`specdec.backends.llamacpp`)
        return None
    try:
        verifies_exactly(dataclasses.replace(loaded, exact="on"))
    except ValueError as error:
        return str(error)
    return None


def settle_exact(loaded: LoadedModel, exact: str) -> tuple[LoadedModel, str]:
    """`loaded` with the server's exactness decided from `exact` (`ModelSpec.exact`: "auto" read as on
    wherever the path can), and the line that says so."""
    check_exact(exact)
    if exact == "off":
        return dataclasses.replace(loaded, exact="off"), (
            "exact verification off (--exact off): the same request may give different text alone and in a batch"
        )
    reason = why_not_exact(loaded)
    if reason is not None:
        if exact == "on":
            raise ValueError(f"--exact on is not possible for this model: {reason}")
        return dataclasses.replace(loaded, exact="off"), f"exact verification off: not possible here ({reason})"
    return dataclasses.replace(loaded, exact="on"), (
        "exact verification on: the same request (greedy, or with the same seed) gives the same text, "
        "alone or in a batch (--exact off trades that for tokens/s)"
    )
