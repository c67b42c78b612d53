"""Hydra heads: Medusa's heads made sequentially dependent on the tokens drafted before them.

Why: a Medusa head guesses token t + 2 + i from the target's state at t alone, so
it cannot know which of its predecessors' guesses its own guess follows; every
branch below a node gets the same children. Hydra (Ankner et al. 2024, arXiv
2402.05109) feeds head i the state *and* the embeddings of the branch so far (the
root, the token the target itself chose at t, then the i tokens drafted on this
branch), so each node's children are guessed for that node's prefix. Drafting
runs one head per tree level (a small product per expanded node), still no pass
of any model.

Head i: x = h + W_i [h ; E(root) ; E(d_1) ; ... ; E(d_i)] + b_i, then Medusa's
residual block(s) and the head over the draft vocabulary. E is the target's own
input embedding (frozen, not saved: `bind`). W_i starts at zero, so a fresh head is
a Medusa head.

Layout: Medusa's (`specdec.proposers.medusa.head`), with `architectures: ["HydraModel"]`,
`model_type: "hydra"` and the input layers `inputs.{i}.weight` [H, (i + 2) H] and
`.bias` [H]. vLLM's Medusa reader does not read it (its heads take no tokens).

Invariants: head i reads exactly i + 1 branch tokens, the root first; in training
those are the text's tokens after t (teacher forcing) and the answer is the target's
greedy token after the last of them (`labels[t + 1 + i]`), the same answer Medusa's
head i is scored against.
"""

from __future__ import annotations

import torch

from specdec.proposers.medusa import MedusaHeads, heads_loss

ARCHITECTURE = "HydraModel"


class HydraHeads(MedusaHeads):
    """Medusa heads whose head i also reads the embeddings of the i + 1 branch tokens before its guess."""

    architecture, model_type = ARCHITECTURE, "hydra"

    def __init__(
        self, hidden: int, vocab_size: int, draft_vocab: int, num_heads: int, layer_id: int, num_layers: int = 1
    ) -> None:
        super().__init__(hidden, vocab_size, draft_vocab, num_heads, layer_id, num_layers)
        self.inputs = torch.nn.ModuleList(
            torch.nn.Linear((i + 2) * hidden, hidden, bias=True) for i in range(num_heads)
        )
        self.embed: list[torch.nn.Embedding] = []  # the target's, in a list: no submodule (not saved, not trained)

    def bind(self, target: torch.nn.Module) -> None:
        self.embed = [target.get_input_embeddings()]

    def head_logits(self, i: int, hidden: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        """Head i: hidden [..., H] and branch [..., i + 1] token ids (root first) -> logits [..., V_d]."""
        if branch.shape[-1] != i + 1:
            raise ValueError(f"hydra head {i} reads {i + 1} branch tokens, got {branch.shape[-1]}")
        dtype = self.dtype
        hidden = hidden.to(dtype)
        embedded = self.embed[0](branch).to(dtype).flatten(-2)  # [..., (i + 1) H]
        x = hidden + self.inputs[i](torch.cat([hidden, embedded], dim=-1))
        return self.lm_heads[i](self.blocks[i](x))

    def logits(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        raise TypeError("hydra heads read the branch's tokens too: call head_logits or train_logits")

    def train_logits(self, tokens: torch.Tensor, features: torch.Tensor) -> list[torch.Tensor]:
        """tokens [B, T], features [B, T, H] -> per head i, logits [B, T, V_d] at every position t,
        reading the text's tokens t + 1 .. t + 1 + i as the branch (zeros past the end, never scored)."""
        width = tokens.shape[1]
        padded = torch.cat([tokens, tokens.new_zeros(tokens.shape[0], self.num_heads + 1)], dim=1)
        ahead = torch.stack([padded[:, j : j + width] for j in range(1, self.num_heads + 2)], dim=-1)
        return [self.head_logits(i, features, ahead[..., : i + 1]) for i in range(self.num_heads)]


def hydra_loss(
    heads: HydraHeads, tokens: torch.Tensor, labels: torch.Tensor, features: torch.Tensor, valid: torch.Tensor,
    to_draft: torch.Tensor,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:  # fmt: skip
    """Weighted loss of every head (Medusa's weights and answers); per head (correct top-1, scored)."""
    return heads_loss(heads.train_logits(tokens, features), labels, valid, to_draft)


@torch.no_grad()
def start_as_medusa(heads: HydraHeads) -> None:
    """Zero the input layers: the fresh head is then the Medusa head it is built on."""
    for layer in heads.inputs:
        layer.weight.zero_()
        layer.bias.zero_()
