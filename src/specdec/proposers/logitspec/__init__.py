"""LogitSpec (Liu et al., arXiv 2507.01449) as parts that its tree and chain proposers share.

Modules, each importing only those above it:
- `retrieval`: the n-gram retrieval for the next and next-next token (and the
  paper's fixed tree);
- `plan`: the trie of candidate nodes and the cost-aware choice of which to verify;
- `learn`: the online acceptance rates (priors, feature keys, counterfactual
  learning from the emitted tokens), one learner for both proposers;
- `sources`: draft sources beyond the request's own text (recycle table,
  session store, datastore);
- `proposer`: the tree proposer, the `logitspec` method (`LogitSpecConfig`);
- `chain`: chain mode, the one most promising chain per step, for engines that
  verify chains (vLLM: `specdec.integrations.vllm`).

Nothing is imported here, so the chain mode loads without the tree proposer's
dependencies.
"""
