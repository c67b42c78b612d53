"""Trained drafters: heads that draft from the target's own hidden states (`eagle3`), their
training text and feature cache (`features`), and `specdec train` (`train`)."""
