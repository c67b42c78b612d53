"""Verification on llama.cpp's engine: a GGUF target driven through llama.cpp's batch API.

Why this exists: on a CPU a decode step of a small model is bound by per-operator
overhead, and llama.cpp's graph runs a step of SmolLM2-135M (Q4_1) in about a
third of the time PyTorch's eager forward needs. This backend keeps every
specdec proposer and acceptance rule and swaps only the verifier: the rows of a
`specdec.engine.batch.Batch` become sequences of one llama.cpp context, and a draft
tree becomes one `llama_decode` batch (through llama-cpp-python's low-level
bindings; nothing of llama.cpp is forked or patched).

How a tree is verified (llama.cpp has no tree mask; it has sequences):
- every leaf of a row's tree gets a sequence id, the row's own one for the
  first leaf and fresh ones (copies of the row's prefix, `llama_memory_seq_cp`)
  for the others; a node belongs to the sequences of the leaves below it;
- llama.cpp lets a token see the cached tokens that share one of its sequences
  and sit at a position up to its own, so a node sees its prefix and its
  ancestors and nothing else: the tree's ancestor-or-self mask;
- after acceptance the sequence of a leaf below the last accepted node becomes
  the row's own, cut after that node; every other sequence of the tree is
  removed, and the cells no sequence holds any more are free.

Invariants:
- a row's sequence holds exactly its committed tokens between passes, at
  positions 0..length-1 (cells need not be contiguous: llama.cpp attends by
  position and sequence, not by cell order);
- the context uses one unified KV buffer (`kv_unified`), which tokens shared by
  several sequences need;
- a row alone in the context gets the bits of plain decoding, measured: llama.cpp
  attends over cells in cell order, so (1) flash attention is on (it skips masked
  cells, so holes and the number of cells change no sum), (2) a one-token pass
  gets a padding token (a single query over 512+ cells takes a split-by-thread
  path with other sums), and (3) only the accepted path's first, contiguous cells
  are kept, the rest of it fed again with the next tree (`commit`). Passes of 64+
  tokens (llama.cpp's tiled attention) and rows sharing the context (cells
  interleave) may round differently, which can change a near tie: measured and
  reported by `benchmarks/llamacpp_bench.py`;
- no hidden states come back: methods that read the target's features (eagle, medusa)
  are refused with a clear error.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdec.backends.contract import PromptFill
from specdec.errors import ModelLoadError
from specdec.tree import DraftTree

DEFAULT_CONTEXT = 8192  # KV cells shared by every row of the context, when the model allows as many
BATCH_TOKENS = 512  # most tokens one llama_decode call takes (prompts are fed in pieces of this size)
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids for rows, tree branches and padding
PAD_SEQUENCE = MAX_SEQUENCES - 1  # the padding token's (`LlamaCppModel.decode`)
EXACT_PIECE = 63  # most tokens of an exact pass: from 64 queries llama.cpp's attention is tiled (other sums)
INSTALL = "pip install llama-cpp-python"

_BACKEND_LOCK = threading.Lock()
_log_callback = None  # kept alive while llama.cpp holds it


def _drop_log(level: int, text: bytes, data: ctypes.c_void_p) -> None:
    """llama.cpp's log lines are dropped: failures come back as return codes, turned into errors here."""


def _bindings():  # noqa: ANN202 - the llama_cpp module
    """llama-cpp-python's low-level bindings, the backend initialized once per process, its log quiet."""
    try:
        import llama_cpp
    except ImportError as error:
        raise ModelLoadError(f"backend 'llamacpp' needs llama-cpp-python: {INSTALL} ({error})") from error
    global _log_callback
    with _BACKEND_LOCK:
        if _log_callback is None:
            llama_cpp.llama_backend_init()
            _log_callback = llama_cpp.llama_log_callback(_drop_log)
            llama_cpp.llama_log_set(_log_callback, None)
    return llama_cpp


class LlamaCppModel:
    """A GGUF model in one llama.cpp context: the KV memory every batch of this engine shares."""

    def __init__(self, gguf_path: Path, config: object, threads: int | None = None, context: int | None = None) -> None:
        """config: the transformers config of the same model (vocabulary size, context limit); threads:
        llama.cpp's threads (default: PyTorch's); context: KV cells (default: the model's limit, at most
        DEFAULT_CONTEXT)."""
        self.lib = _bindings()
        self.config = config
        self.device = torch.device("cpu")
        limit = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.max_length = limit
        self.cells = context or (min(limit, DEFAULT_CONTEXT) if limit else DEFAULT_CONTEXT)
        lib = self.lib
        self._model = lib.llama_model_load_from_file(str(gguf_path).encode(), lib.llama_model_default_params())
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {gguf_path}")
        params = lib.llama_context_default_params()
        params.n_ctx = self.cells
        params.n_batch = params.n_ubatch = BATCH_TOKENS
        params.n_seq_max = MAX_SEQUENCES
        params.kv_unified = True
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED  # see the module docstring
        params.n_threads = params.n_threads_batch = threads or torch.get_num_threads()
        self._ctx = lib.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise ModelLoadError(f"llama.cpp could not make a context of {self.cells} cells for {gguf_path}")
        self.memory = lib.llama_get_memory(self._ctx)
        self.vocab_size = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        if self.vocab_size != int(config.vocab_size):
            raise ModelLoadError(
                f"{gguf_path}: llama.cpp sees {self.vocab_size} tokens, the tokenizer {config.vocab_size}"
            )
        self._batch = lib.llama_batch_init(BATCH_TOKENS + 1, 0, MAX_SEQUENCES)
        # The last id is the padding token's (see `decode`); pop() hands out 0 first.
        self.free_sequences = list(range(MAX_SEQUENCES - 2, -1, -1))

    def batched(self, exact: bool = False) -> LlamaCppBatch:
        """An empty batch of rows on this context (`specdec.engine.batch.Batch`'s verifier); exact: pad
        one-token passes (see `decode`)."""
        return LlamaCppBatch(self, exact)

    def take_sequence(self) -> int:
        if not self.free_sequences:
            raise RuntimeError(f"llama.cpp context out of sequence ids ({MAX_SEQUENCES}): fewer rows or smaller trees")
        return self.free_sequences.pop()

    def drop_sequence(self, seq: int, start: int = -1) -> None:
        """Remove `seq` from the cells at positions >= start (all of them for -1); a whole one is freed."""
        self.lib.llama_memory_seq_rm(self.memory, seq, start, -1)
        if start < 0:
            self.free_sequences.append(seq)

    def copy_sequence(self, source: int, target: int) -> None:
        self.lib.llama_memory_seq_cp(self.memory, source, target, -1, -1)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], sequences: Sequence[Sequence[int]],
               outputs: Sequence[bool], exact: bool = False) -> torch.Tensor:
        """`decode_one` over the tokens; exact: in pieces of at most EXACT_PIECE tokens (a tree's
        nodes come after their ancestors, so a later piece sees an earlier one's cells), each one-token
        pass padded: the bits of plain decoding's one-token passes, measured."""
        if not exact or len(tokens) <= EXACT_PIECE:
            return self.decode_one(tokens, positions, sequences, outputs, exact)
        pieces = range(0, len(tokens), EXACT_PIECE)
        return torch.cat([
            self.decode_one(*(part[i : i + EXACT_PIECE] for part in (tokens, positions, sequences, outputs)), True)
            for i in pieces
        ])

    def decode_one(self, tokens: Sequence[int], positions: Sequence[int], sequences: Sequence[Sequence[int]],
                   outputs: Sequence[bool], pad: bool = False) -> torch.Tensor:
        """One llama_decode over at most BATCH_TOKENS tokens; the logits [n_outputs, V] (float32) of the
        tokens whose `outputs` flag is set, in batch order.

        pad: a one-token pass gets a padding token of its own sequence (removed right after): llama.cpp's
        attention takes another path for a single query over 512+ cells (the cells split between
        threads), whose sums differ from the many-query path's that verifies trees. It costs: the
        pass does a second token's work.
        """
        if pad and len(tokens) == 1:
            tokens, positions = [*tokens, tokens[0]], [*positions, 0]
            sequences, outputs = [*sequences, [PAD_SEQUENCE]], [*outputs, False]
        batch, count = self._batch, len(tokens)
        for i in range(count):
            batch.token[i] = tokens[i]
            batch.pos[i] = positions[i]
            batch.n_seq_id[i] = len(sequences[i])
            for j, seq in enumerate(sequences[i]):
                batch.seq_id[i][j] = seq
            batch.logits[i] = outputs[i]
        batch.n_tokens = count
        try:
            code = self.lib.llama_decode(self._ctx, batch)
        finally:
            if sequences[-1] == [PAD_SEQUENCE]:
                self.lib.llama_memory_seq_rm(self.memory, PAD_SEQUENCE, -1, -1)
        if code != 0:
            reason = "no room in the KV cache" if code == 1 else f"llama_decode returned {code}"
            raise RuntimeError(f"llama.cpp could not run a pass of {count} tokens: {reason} ({self.cells} cells)")
        wanted = sum(bool(flag) for flag in outputs)
        if not wanted:
            return torch.empty(0, self.vocab_size)
        pointer = self.lib.llama_get_logits(self._ctx)
        return torch.from_numpy(np.ctypeslib.as_array(pointer, shape=(wanted, self.vocab_size)).copy())

    def close(self) -> None:
        if self._ctx:
            self.lib.llama_batch_free(self._batch)
            self.lib.llama_free(self._ctx)
            self.lib.llama_model_free(self._model)
            self._ctx = self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the bindings may be gone already
            pass


@dataclass
class _Row:
    seq: int  # the row's own sequence: its committed tokens (but `refeed`)
    length: int  # committed tokens
    # Accepted tokens whose entries were dropped to keep the row's cells in position order; they are
    # fed again, without logits, ahead of the row's next tree (see `LlamaCppBatch.commit`).
    refeed: list[int] = field(default_factory=list)
    tree_tokens: list[int] = field(default_factory=list)  # the pending tree's tokens
    tree_sequences: list[int] = field(default_factory=list)  # the pending tree's leaf sequences
    node_sequences: list[list[int]] = field(default_factory=list)  # per pending node


class LlamaCppBatch:
    """Rows of one `Batch` as llama.cpp sequences; the `specdec.backends.contract.Rows` calls."""

    invariant = False

    def __init__(self, model: LlamaCppModel, exact: bool = False) -> None:
        self.model = model
        self.exact = exact
        self.device = model.device
        self.rows: list[_Row] = []
        self._staged_for: PromptFill | None = None  # the PromptFill whose tokens the staging sequence holds
        self._staging: int | None = None
        self._capture: tuple[int, ...] = ()

    @property
    def capture(self) -> tuple[int, ...]:
        return self._capture

    @capture.setter
    def capture(self, layers: tuple[int, ...]) -> None:
        if layers:
            raise ValueError("backend 'llamacpp' returns no hidden states: methods that read the target's "
                             "features (eagle, medusa) need --backend torch")
        self._capture = ()

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> list[int]:
        return [row.length for row in self.rows]

    def add(self, prompt_ids: Sequence[int]) -> tuple[int, torch.Tensor, None]:
        return self.fill(PromptFill(prompt_ids), len(prompt_ids))

    def fill(self, prompt: PromptFill, max_tokens: int) -> tuple[int, torch.Tensor, None] | None:
        """Run the next `max_tokens` (at most) of a `PromptFill` on a staging sequence; on its last chunk
        the sequence becomes a new row: (slot, last position's logits [V], None). Else None."""
        model = self.model
        if self._staged_for is not prompt or prompt.done == 0:
            if self._staging is not None:
                model.drop_sequence(self._staging)
            self._staging, self._staged_for, prompt.done = model.take_sequence(), prompt, 0
        ids = prompt.ids.tolist()
        end = min(prompt.done + max_tokens, len(ids))
        logits = None
        while prompt.done < end:
            stop = min(end, prompt.done + BATCH_TOKENS)
            count = stop - prompt.done
            last = [False] * (count - 1) + [stop == len(ids)]
            logits = model.decode(ids[prompt.done : stop], range(prompt.done, stop), [[self._staging]] * count, last)
            prompt.done = stop
        if prompt.done < len(ids):
            return None
        self.rows.append(_Row(self._staging, len(ids)))
        self._staging = self._staged_for = None
        return self.num_rows - 1, logits[-1], None

    def remove(self, row: int) -> int | None:
        """Free a row; the last row moves into its slot. Returns the slot that moved (None if none)."""
        self.model.drop_sequence(self.rows[row].seq)
        last = self.num_rows - 1
        self.rows[row] = self.rows[last]
        self.rows.pop()
        return last if row != last else None

    def verify_trees(self, trees: Sequence[DraftTree]) -> list[tuple[torch.Tensor, None]]:
        """One llama_decode over every row's tree; per row, logits [n_b, V] (float32) and None."""
        if len(trees) != self.num_rows or not trees:
            raise ValueError(f"need one tree per row ({self.num_rows}), got {len(trees)}")
        if sum(tree.num_nodes + len(row.refeed) for row, tree in zip(self.rows, trees, strict=True)) > BATCH_TOKENS:
            raise ValueError(f"a pass holds at most {BATCH_TOKENS} tree nodes")
        tokens: list[int] = []
        positions: list[int] = []
        sequences: list[list[int]] = []
        outputs: list[bool] = []
        for row, tree in zip(self.rows, trees, strict=True):
            row.node_sequences = self._branch(row, tree)
            row.tree_tokens = tree.token_list
            tokens += row.refeed + row.tree_tokens
            positions += [*range(row.length - len(row.refeed), row.length), *(row.length + tree.depths).tolist()]
            sequences += [row.tree_sequences] * len(row.refeed) + row.node_sequences
            outputs += [False] * len(row.refeed) + [True] * tree.num_nodes
            row.refeed = []
        logits = self.model.decode(tokens, positions, sequences, outputs, self.exact)
        out, start = [], 0
        for tree in trees:
            out.append((logits[start : start + tree.num_nodes], None))
            start += tree.num_nodes
        return out

    def _branch(self, row: _Row, tree: DraftTree) -> list[list[int]]:
        """Give each leaf of `tree` a sequence holding the row's prefix; each node's sequences."""
        leaves = tree.leaves
        row.tree_sequences = [row.seq]
        for _ in leaves[1:]:
            seq = self.model.take_sequence()
            self.model.copy_sequence(row.seq, seq)
            row.tree_sequences.append(seq)
        if len(leaves) == 1:
            return [[row.seq]] * tree.num_nodes
        below = tree.ancestor_mask[leaves].T  # [N, L]: leaf l lies below (or is) node n
        return [[row.tree_sequences[leaf] for leaf in np.flatnonzero(flags)] for flags in below.numpy()]

    def commit(self, paths: Sequence[Sequence[int]]) -> None:
        """Keep each row's accepted path (root first) as its committed tokens; drop the rest of its tree.

        Entries stay only for the part of the path that sits in the tree's first cells (nodes 0..j-1):
        llama.cpp sums attention over cells in cell order and places new tokens in the first free
        cells, so a path with holes would make later passes sum in another order than plain
        decoding's (logits measured up to ~0.8 apart). The rest of the path is fed again with the
        next tree (`_Row.refeed`), which costs a few tokens of a pass, not a pass.
        """
        if len(paths) != self.num_rows:
            raise ValueError(f"need one path per row of the pass ({self.num_rows}), got {len(paths)}")
        for row, path in zip(self.rows, paths, strict=True):
            path = list(path)
            if not path or path[0] != 0 or max(path) >= len(row.node_sequences):
                raise ValueError(f"commit needs a root-first path inside the tree, got {path}")
            contiguous = next((j for j, node in enumerate(path) if node != j), len(path))
            keep = row.node_sequences[path[-1]][0]  # a leaf below the last accepted node
            if contiguous < len(row.tree_tokens):  # else nothing to drop: the memory stays untouched
                self.model.drop_sequence(keep, row.length + contiguous)
            row.refeed = [row.tree_tokens[node] for node in path[contiguous:]]
            for seq in row.tree_sequences:
                if seq != keep:
                    self.model.drop_sequence(seq)
            row.seq, row.length = keep, row.length + len(path)
            row.tree_sequences, row.node_sequences = [], []

    def rollback(self) -> None:
        """Drop the pending trees (as if none had been verified): what a timing pass needs."""
        for row in self.rows:
            for seq in row.tree_sequences:
                self.model.drop_sequence(seq, row.length if seq == row.seq else -1)
            row.tree_sequences, row.node_sequences = [], []

    def release(self) -> None:
        """Free every row's and the staging prompt's sequences."""
        self.rollback()
        while self.rows:
            self.remove(self.num_rows - 1)
        if self._staging is not None:
            self.model.drop_sequence(self._staging)
            self._staging = self._staged_for = None


@dataclass(frozen=True)
class LlamaCppTarget:
    """What an engine verifies on with this backend: the shared context, and whether passes are exact."""

    model: LlamaCppModel
    exact: bool

    @property
    def config(self) -> object:
        return self.model.config

    @property
    def max_length(self) -> int:
        return self.model.max_length

    @property
    def device(self) -> torch.device:
        return self.model.device

    def batched(self) -> LlamaCppBatch:
        return self.model.batched(self.exact)
