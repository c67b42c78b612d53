"""The expensive parts some proposers need, made once at server startup: cost curves, draft models, calibrations.

Why: building a proposer can cost far more than a request: LogitSpec's adaptive
tree measures the target's forward-pass cost curve, `draft` loads (and may
convert) a second model, `layerskip` calibrates which layers to skip, `datastore`
opens (and checks) a datastore folder named by the operator. Requests
must never reach that work (see `specdec.serve.options`), so each method's
build is split into `prepare` (the expensive part, keyed by server-side options
only, run at startup) and `assemble` (cheap: a proposer from a config and its
prepared parts).

Invariants:
- `needs(config)` reads only server-side options (a request cannot change it),
  so the parts a server prepared at startup are all its requests can ever use;
- `assemble` never loads, converts, measures or calibrates when given its parts;
- a method without a recipe needs no parts: `config.build(loaded)` is cheap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from specdec.models import LoadedModel


@dataclass(frozen=True)
class Recipe:
    """How one method's proposers are made from parts prepared once."""

    needs: Callable[[Any], Hashable | None]  # the parts a config needs (None: none)
    prepare: Callable[[LoadedModel, Any], Any]  # make them: startup only, may take long
    assemble: Callable[[LoadedModel, Any, Any], Any]  # (loaded, config, parts) -> a fresh proposer, cheap
    missing: str  # why a request for an unprepared config is refused, and how an operator fixes it


# ------------------------------------------------------------------ logitspec: the tree-cost curve, a datastore
def _logitspec_needs(config: Any) -> Hashable | None:
    if not (config.adaptive or config.datastore):
        return None
    return ("logitspec", config.costs_dir if config.adaptive else None, config.datastore)


def _logitspec_prepare(loaded: LoadedModel, config: Any) -> Any:
    from specdec.engine.costs import load_or_measure

    costs = load_or_measure(loaded, config.costs_dir or None) if config.adaptive else None
    return costs, config.open_datastore(loaded)  # DatastoreError (at startup) for an unusable folder


def _logitspec_assemble(loaded: LoadedModel, config: Any, parts: Any) -> Any:
    costs, datastore = parts or (None, None)  # None: nothing to prepare (the paper's tree, no datastore)
    return config.assemble(loaded, costs, datastore)  # LogitSpecConfig.build, with its parts made once


# ------------------------------------------------------------------ draft: the draft model
def _draft_needs(config: Any) -> Hashable:
    return ("draft", config.draft_model, config.cache_dir, config.quantize)


def _draft_prepare(loaded: LoadedModel, config: Any) -> Any:
    from specdec.models import load_model
    from specdec.proposers.draft_module import check_same_tokenizer

    if not config.draft_model:
        raise ValueError(
            "draft: give the draft model, e.g. --method-config draft:draft_model=qwen2.5-coder-0.5b"
        )
    cache_dir = config.cache_dir or None
    draft = load_model(config.draft_model, dtype=loaded.dtype, device=str(loaded.device), cache_dir=cache_dir)
    check_same_tokenizer(draft.tokenizer, loaded.tokenizer, f"draft model {config.draft_model!r}")
    return config.prepare(loaded, draft.model)  # quantized here, once, when `quantize` asks for it


def _draft_assemble(loaded: LoadedModel, config: Any, prepared: Any) -> Any:
    return config.build_prepared(loaded, prepared)


# ------------------------------------------------------------------ layerskip: the calibrated skip set
def _layerskip_needs(config: Any) -> Hashable | None:
    return None if config.skip else ("calibration", config.cache_dir, config.verify_cost)


def _layerskip_prepare(loaded: LoadedModel, config: Any) -> tuple[int, ...]:
    from specdec.proposers.layerskip import calibrated_skip

    return calibrated_skip(loaded, config.verify_cost, config.cache_dir or None)


def _layerskip_assemble(loaded: LoadedModel, config: Any, skip: tuple[int, ...] | None) -> Any:
    # With a skip set the build is a view of the target; without one (nothing paid off in the
    # calibration) LayerSkipConfig.build reads the cached calibration and decodes plainly.
    if skip:
        config = dataclasses.replace(config, skip="+".join(str(layer) for layer in skip))
    return config.build(loaded)


# ------------------------------------------------------------------ datastore: the opened datastore folder
def _datastore_needs(config: Any) -> Hashable:
    return ("datastore", config.path)


def _datastore_prepare(loaded: LoadedModel, config: Any) -> Any:
    return config.open(loaded)  # DatastoreError (at startup) for a missing path or an unusable folder


def _datastore_assemble(loaded: LoadedModel, config: Any, datastore: Any) -> Any:
    from specdec.proposers.datastore_lookup import DatastoreProposer

    return DatastoreProposer(config, datastore, loaded.eos_token_ids)


RECIPES: dict[str, Recipe] = {
    "logitspec": Recipe(
        _logitspec_needs,
        _logitspec_prepare,
        _logitspec_assemble,
        "logitspec with adaptive=true needs the tree-cost curve (and a datastore, if one is named), which "
        "this server did not prepare at startup; ask with adaptive=false (operator: specdec serve "
        "--method-config logitspec, or --method-config logitspec:datastore=DIR)",
    ),
    "draft": Recipe(
        _draft_needs,
        _draft_prepare,
        _draft_assemble,
        "draft needs a draft model set by the server, and this server has none "
        "(operator: specdec serve --method-config draft:draft_model=NAME)",
    ),
    "layerskip": Recipe(
        _layerskip_needs,
        _layerskip_prepare,
        _layerskip_assemble,
        "layerskip needs a calibrated skip set, which this server did not prepare at startup "
        "(operator: specdec serve --method-config layerskip, or --method-config layerskip:skip=4+6+8)",
    ),
    "datastore": Recipe(
        _datastore_needs,
        _datastore_prepare,
        _datastore_assemble,
        "datastore needs a datastore folder opened by the server at startup, and this server has none "
        "(operator: specdec serve --method-config datastore:path=DIR)",
    ),
}
