"""The `datastore` method: REST-style drafting from an external corpus (He et al., NAACL 2024).

Why: where the request itself has nothing to copy from, a corpus of similar
text (a code base, documentation) may: each step the context's longest suffix
found in the datastore (`specdec.datastore`, built with `specdec datastore
build FILES -o DIR`) proposes the corpus's most frequent continuations.

Per step: `Datastore.branches(context, max_ngram, length, max_branches,
min_ngram)`: up to `max_branches` continuations with distinct first tokens,
most frequent first, each continued along its most frequent path; they are cut
after the first end-of-sequence token and merged into a trie of at most
`budget` nodes (`max_branches=1` gives a chain, as in prompt lookup). Like REST,
only the datastore is consulted, never the request's own text (that is `pld`;
LogitSpec combines both).

Differences from REST: REST retrieves a few thousand occurrences of the
longest matching suffix and picks tree nodes by prefix frequency over all of
them; here frequencies are counted level by level along each branch (exactly
in small ranges, on a 256-occurrence sample in large ones), which gives the
same greedy most-frequent paths without materialising the occurrences.

Invariants: the datastore path is set by the user or the server operator
(server-side only); a missing, corrupt or foreign-tokenizer datastore fails at
build time with `DatastoreError`; drafts are deterministic (`draft_probs=None`),
never deeper than `ctx.max_depth`, never more than `budget` nodes.
"""

from __future__ import annotations

from typing import Annotated

from specdec.datastore import Datastore, DatastoreError
from specdec.engine.generation import ProposalContext
from specdec.engine.verify import VerifyResult
from specdec.models import LoadedModel
from specdec.proposers.base import ProposerBase
from specdec.proposers.pld import check_min_ngram, cut_after_eos
from specdec.proposers.schema import Preparation, method_config, option
from specdec.tree import DraftTree


@method_config("datastore")
class DatastoreConfig:
    """REST-style drafting from a datastore folder.

    path: the datastore folder (`specdec datastore build`; server-side only);
    max_ngram / min_ngram: longest and shortest context suffix matched;
    max_continuation: longest draft branch; max_branches: distinct first tokens (1 = a chain);
    budget: most tree nodes, root included.
    """

    path: str = ""
    max_ngram: Annotated[int, option(ge=1, request_max=16)] = 8
    min_ngram: Annotated[int, option(ge=1, request_max=16)] = 2
    max_continuation: Annotated[int, option(ge=1, request_max=20)] = 10
    max_branches: Annotated[int, option(ge=1, request_max=8)] = 1
    budget: Annotated[int, option(ge=1, request_max=64)] = 32

    def __post_init__(self) -> None:
        check_min_ngram(self.min_ngram, self.max_ngram)

    def open(self, loaded: LoadedModel) -> Datastore:
        """The datastore at `path`, checked against the model's tokenizer (DatastoreError if unusable)."""
        if not self.path:
            raise DatastoreError(
                "datastore: give the datastore folder, e.g. --method datastore:path=DIR "
                "(build one with `specdec datastore build FILES... -o DIR`)"
            )
        return Datastore.open(self.path, loaded.tokenizer)

    def preparation(self) -> Preparation:
        """The datastore folder, opened and checked once."""
        return Preparation(
            ("datastore", self.path),
            self.open,  # DatastoreError (at startup) for a missing path or an unusable folder
            lambda loaded, datastore: DatastoreProposer(self, datastore, loaded.eos_token_ids),
            "datastore needs a datastore folder opened by the server at startup, and this server has none "
            "(operator: specdec serve --method-config datastore:path=DIR)",
        )

    def build(self, loaded: LoadedModel) -> DatastoreProposer:
        return DatastoreProposer(self, self.open(loaded), loaded.eos_token_ids)


class DatastoreProposer(ProposerBase):
    deterministic_drafts = True  # draft_probs None: gated by the floor when sampling too
    draft_source = "datastore"
    prunable = True  # a batch may cut the tree to its budget

    def __init__(
        self, config: DatastoreConfig, datastore: Datastore, eos_token_ids: tuple[int, ...] = ()
    ) -> None:
        self.config = config
        self.datastore = datastore
        self.eos_token_ids = frozenset(eos_token_ids)

    def begin(self, prompt_ids: list[int]) -> None:
        pass  # no per-request state: the datastore is read-only

    def propose(self, ctx: ProposalContext) -> DraftTree:
        root = ctx.token_ids[-1]
        length = min(self.config.max_continuation, ctx.max_depth)
        if length <= 0 or self.config.budget <= 1:
            return DraftTree.chain(root)
        config = self.config
        found = self.datastore.branches(
            ctx.token_ids, config.max_ngram, length, config.max_branches, config.min_ngram
        )
        branches = [cut_after_eos(branch, self.eos_token_ids) for branch in found]
        return DraftTree.from_branches(root, branches, config.budget)

    def observe(self, result: VerifyResult) -> None:
        pass  # the datastore does not learn
