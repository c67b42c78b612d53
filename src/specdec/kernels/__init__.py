"""specdec's C++ kernels, one extension built on first use: the block products (4-, 5-, 6- and 8-bit weights on bf16
or 8-bit activations), tree attention and the fused decoder layer, with their build (`q4_kernel.load_extension`),
their Python wrappers (`Q4Linear`, `Q5Linear`, `Q6Linear`, `Q8Linear`) and their plain-PyTorch references.

Why a package of its own: the kernels are an idea apart from any backend. Each op has a scalar C++ version and
per-ISA paths under the same name (`csrc/`: AVX-512, AVX2 and AVX-VNNI, NEON), picked at run time and capped by
`SPECDEC_KERNELS`, and the tests hold every path to the scalar one's bits, as ggml does. The torch backend
(`specdec.backends.torch`) runs them; nothing here imports a backend.
"""
