"""Everything that runs a verification pass, behind one contract (`contract.Target`, `contract.Rows`).

`registry` maps a backend name (`specdec.choices.BACKENDS`) to its implementation: `torch/` (transformers
eager: target, KV caches, batch rows, attention plans, invariant attention, packed and 4-bit products),
`compiled` (the same pass compiled by inductor) and `llamacpp` (llama.cpp's engine through its batch
API). `timing_cache` keys the measured cost curves by what a backend verifies on. Nothing here imports
the engine, the proposers or the applications above it, and they import only `contract` and `registry`
of it: the registry answers what else they need to know of a backend as capabilities
(tests/test_imports.py checks both directions).
"""
