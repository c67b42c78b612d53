"""The transformers-on-PyTorch backend: one model verifying trees for one sequence or many rows."""
