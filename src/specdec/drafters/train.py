"""`specdec train`: fit an EAGLE-3 head to a target on this machine, with training-time test.

Why training-time test: at inference the head drafts several tokens in a row,
each step reading its own previous output instead of the target's feature.
Trained only on target features (one step), it never sees its own outputs and
its accuracy falls off after the first token. So each batch is unrolled for
`ttt_steps` steps (EAGLE-3; SpecForge does the same): step k at anchor t reads
the head's step k-1 output, the token x[t+k], sits at position t+k-1, attends
to the target-fed entries up to t and to its own earlier steps at t, and is
scored against the target's greedy token at t+k. Step k's loss weighs 0.8^(k-1).

The draft vocabulary is the `draft_vocab` tokens the target most often chose
on the training text; a label outside it cannot be drafted and counts as a miss.

Invariants: same seed, data and options give the same head; a checkpoint holds
the head, the optimizer, the step and the generator, so `--resume` continues
the run as if it had not stopped; the held-out split (the last `holdout` share
of the rows, never trained on) is where the per-step accuracy is measured.

`arch="medusa"` trains Medusa-1 heads (`specdec.proposers.medusa.head`) with the same
data, cache, loop, checkpoints and held-out split: their feature is the
target's last hidden state, and "step" k is head k. `arch="hydra"` trains Hydra
heads (`specdec.proposers.hydra.head`) the same way, each head also reading the text's
tokens before its answer.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from specdec.drafters.features import Example, batches, build_cache, collate, load_cache, read_rows
from specdec.models import LoadedModel
from specdec.proposers.eagle import Eagle3Head, default_layer_ids, head_config, save_head, target_fingerprint
from specdec.proposers.hydra import HydraHeads, hydra_loss, start_as_medusa
from specdec.proposers.medusa import MedusaHeads, medusa_loss, save_medusa

CHECKPOINT = "checkpoint.pt"
STEP_DECAY = 0.8
ARCHES = ("eagle3", "medusa", "hydra")
HEADS_ARCHES = ("medusa", "hydra")  # heads on the target's last hidden state


@dataclass(frozen=True)
class TrainConfig:
    data: str
    out: str
    arch: str = "eagle3"  # or "medusa", "hydra"
    cache: str = ""  # feature shards folder ("" = <out>/features)
    draft_vocab: int = 8192
    max_len: int = 512
    epochs: float = 2.0
    lr: float = 1e-3
    tokens_per_batch: int = 2048
    ttt_steps: int = 3  # eagle3: draft steps unrolled per position
    heads: int = 3  # medusa, hydra: future positions, one head each
    holdout: float = 0.05
    seed: int = 0
    checkpoint_every: int = 200
    max_steps: int = 0  # stop after this many optimizer steps (0: at the end; the schedule spans `epochs`)
    resume: bool = False

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise ValueError(f"--arch must be one of {', '.join(ARCHES)}, got {self.arch!r}")
        lows = (("draft_vocab", 2), ("max_len", 16), ("tokens_per_batch", 16), ("ttt_steps", 1), ("heads", 1))
        for name, low in lows:
            if getattr(self, name) < low:
                raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if not 0 < self.holdout < 0.5:
            raise ValueError(f"--holdout must be in (0, 0.5), got {self.holdout}")
        if not self.epochs > 0 or not self.lr > 0:
            raise ValueError("--epochs and --lr must be positive")


def ttt_loss(
    head: Eagle3Head, tokens: torch.Tensor, labels: torch.Tensor, features: torch.Tensor, valid: torch.Tensor,
    steps: int, to_draft: torch.Tensor,
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Weighted loss over `steps` unrolled draft steps; per step (correct top-1, scored positions)."""
    batch, width = tokens.shape
    anchors = torch.arange(width)
    causal = anchors[None, :] <= anchors[:, None]  # [T, T]: target-fed keys up to the anchor
    eye = torch.eye(width, dtype=torch.bool)
    hidden = head.fuse(features)
    keys, values, masks, total, scores = [], [], [], 0.0, []
    for k in range(1, steps + 1):
        tok_k, lab_k, ok_k = _shift(tokens, k, 0), _shift(labels, k, 0), _shift(valid, k, False)
        q, key, value = head.qkv(hidden, tok_k, (anchors + k - 1)[None].expand(batch, -1))
        keys.append(key)
        values.append(value)
        masks.append(causal if k == 1 else eye)
        mask = torch.cat(masks, dim=1)[None, None]  # [1, 1, T, kT]
        logits, hidden = head.finish(hidden, q, torch.cat(keys, 2), torch.cat(values, 2), mask)
        target = to_draft[lab_k].masked_fill(~ok_k, -100)  # out-of-vocabulary labels stay -100 (ignored)
        scored = ok_k & (target >= 0)
        if scored.any():
            total = total + STEP_DECAY ** (k - 1) * F.cross_entropy(logits[scored], target[scored])
        correct = int((logits.argmax(-1) == target)[ok_k].sum())
        scores.append((correct, int(ok_k.sum())))
    return total, scores


def _shift(x: torch.Tensor, k: int, fill: int | bool) -> torch.Tensor:
    """x [B, T] moved k places left along T, the k places at the end filled."""
    return torch.cat([x[:, k:], x.new_full((x.shape[0], k), fill)], dim=1)


def choose_vocab(examples: list[Example], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` target ids the target chose most often (ties by id), as the draft vocabulary."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for ex in examples:
        counts += torch.bincount(ex.labels, minlength=vocab_size)
    size = min(size, vocab_size)
    return torch.sort(torch.topk(counts, size, sorted=True).indices).values


def batch_loss(
    head: torch.nn.Module, batch: list[Example], config: TrainConfig, to_draft: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The arch's loss on one batch, and per step (correct top-1, scored positions)."""
    tokens, labels, features, valid = collate(batch)
    if config.arch == "hydra":
        return hydra_loss(head, tokens, labels, features, valid, to_draft)
    if config.arch == "medusa":
        return medusa_loss(head, labels, features, valid, to_draft)
    return ttt_loss(head, tokens, labels, features, valid, config.ttt_steps, to_draft)


@torch.no_grad()
def evaluate(head: torch.nn.Module, examples: list[Example], config: TrainConfig, to_draft: torch.Tensor) -> list[float]:
    """Top-1 accuracy per draft step (per head) on `examples` (the target's greedy token as the answer)."""
    head.eval()
    totals: list[list[int]] = []
    gen = torch.Generator().manual_seed(0)
    for batch in batches(examples, config.tokens_per_batch, gen):
        _, scores = batch_loss(head, batch, config, to_draft)
        totals = totals or [[0, 0] for _ in scores]
        for total, (right, seen) in zip(totals, scores, strict=True):
            total[0] += right
            total[1] += seen
    head.train()
    return [right / seen if seen else 0.0 for right, seen in totals]


def train(loaded: LoadedModel, config: TrainConfig, log=print) -> dict:
    """Train a head for `loaded` as `config` says; writes the head folder and returns its summary."""
    model = loaded.model
    torch.manual_seed(config.seed)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    layer_ids = (model.config.num_hidden_layers,) if config.arch in HEADS_ARCHES else default_layer_ids(
        model.config.num_hidden_layers
    )
    rows = read_rows(config.data, loaded.tokenizer, config.max_len)
    cache = build_cache(model, rows, layer_ids, config.cache or out / "features", config.max_len)
    examples = load_cache(cache)
    split = max(1, int(len(examples) * (1 - config.holdout)))
    if split >= len(examples):
        raise ValueError(f"--data has {len(examples)} rows: too few to hold some out (need at least 2)")
    trainset, heldout = examples[:split], examples[split:]
    vocab = choose_vocab(trainset, config.draft_vocab, model.config.vocab_size)
    head = _make_head(model, config, layer_ids, vocab)
    to_draft = torch.full((model.config.vocab_size,), -100, dtype=torch.int64)
    to_draft[vocab] = torch.arange(vocab.numel())
    step, seconds = _fit(head, trainset, config, to_draft, out / CHECKPOINT, log)
    accuracy = evaluate(head, heldout, config, to_draft)
    log("held-out top-1 accuracy per draft step: " + ", ".join(f"{a:.3f}" for a in accuracy))
    summary = {
        "train_config": asdict(config), "steps": step, "train_tokens": sum(len(e.tokens) for e in trainset),
        "heldout_examples": len(heldout), "heldout_accuracy": accuracy, "layer_ids": list(layer_ids),
        "target": loaded.name, "target_fingerprint": target_fingerprint(model.get_input_embeddings().weight),
        "train_seconds": seconds,
    }
    if config.arch in HEADS_ARCHES:
        save_medusa(head, out, extra={"specdec": summary})
    else:
        save_head(head, out, extra={"specdec": summary})
    (out / "README.md").write_text(model_card(summary))
    return summary


def _make_head(model: torch.nn.Module, config: TrainConfig, layer_ids: tuple[int, ...], vocab: torch.Tensor):
    """A fresh head whose output side starts as the target's own (see `_start_from_target`)."""
    if config.arch in HEADS_ARCHES:
        mc = model.config
        kind = HydraHeads if config.arch == "hydra" else MedusaHeads
        head = kind(mc.hidden_size, mc.vocab_size, vocab.numel(), config.heads, layer_ids[0])
        head.token_map.copy_(vocab)
        head.bind(model)
    else:
        head = Eagle3Head(head_config(model.config, layer_ids, vocab.numel()), model.get_input_embeddings())
        head.set_vocab(vocab)
    _start_from_target(head, model, vocab)
    return head.train()


def _fit(
    head: torch.nn.Module, trainset: list[Example], config: TrainConfig, to_draft: torch.Tensor, ckpt: Path, log
) -> tuple[int, float]:
    """The optimizer loop, resumable from `ckpt`; (steps done, seconds spent)."""
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    tokens_per_epoch = sum(len(e.tokens) for e in trainset)
    total_steps = max(1, math.ceil(config.epochs * tokens_per_epoch / config.tokens_per_batch))
    stop = min(total_steps, config.max_steps or total_steps)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.lr, total_steps=total_steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(config.seed)
    step, seen_tokens, skip, epoch_state = 0, 0, 0, gen.get_state()
    if config.resume and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, seen_tokens, skip, epoch_state = state["step"], state["seen_tokens"], state["in_epoch"], state["epoch"]
        log(f"resumed at step {step}")
    bar = tqdm(total=stop, initial=step, unit="step", desc="train", dynamic_ncols=True)
    started = time.perf_counter()
    while step < stop:
        if skip:  # resuming inside an epoch: replay its order, skip the batches already trained on
            gen.set_state(epoch_state)
        else:
            epoch_state = gen.get_state()
        for in_epoch, batch in enumerate(batches(trainset, config.tokens_per_batch, gen), start=1):
            if in_epoch <= skip:
                continue
            if step >= stop:
                break
            loss, scores = batch_loss(head, batch, config, to_draft)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            seen_tokens += sum(len(e.tokens) for e in batch)
            rate = seen_tokens / max(1e-9, time.perf_counter() - started)
            acc = scores[0][0] / max(1, scores[0][1])
            bar.set_postfix(loss=f"{loss.item():.3f}", acc1=f"{acc:.2f}", tok_s=f"{rate:.0f}")
            bar.update(1)
            if step % config.checkpoint_every == 0 or step == stop:
                state = {"step": step, "seen_tokens": seen_tokens, "in_epoch": in_epoch, "epoch": epoch_state}
                _checkpoint(ckpt, head, optimizer, schedule, state)
        skip = 0
    bar.close()
    return step, round(time.perf_counter() - started, 1)


def model_card(summary: dict) -> str:
    """The head folder's README: what it was trained for, on what, how, and how well."""
    config = summary["train_config"]
    accuracy = ", ".join(f"step {i}: {a:.3f}" for i, a in enumerate(summary["heldout_accuracy"], start=1))
    if config["arch"] == "hydra":
        title = f"# Hydra heads for {summary['target']}\n\n"
        design = (
            f"Trained by `specdec train --arch hydra` ({config['heads']} heads, one residual block each; head k "
            "reads the target's state and the embeddings of the k tokens before its guess, the target's own "
            "next token first). Layout: Medusa's with `HydraModel` and the input layers `inputs.{k}`.\n\n"
        )
    elif config["arch"] == "medusa":
        title = f"# Medusa heads for {summary['target']}\n\n"
        design = (
            f"Trained by `specdec train --arch medusa` ({config['heads']} heads, one residual block each; head k "
            "guesses the token k + 1 places after the target's own next token). Layout: vLLM's Medusa "
            "(`MedusaModel`, config.json + model.safetensors with `token_map`).\n\n"
        )
    else:
        title = f"# EAGLE-3 head for {summary['target']}\n\n"
        design = (
            f"Trained by `specdec train` (training-time test over {config['ttt_steps']} draft steps). Layout: "
            "`LlamaForCausalLMEagle3` (config.json + model.safetensors), as vLLM and SGLang read EAGLE-3 "
            "drafters; the token embedding is the target's.\n\n"
        )
    return (
        title + design +
        f"- target hidden states read: layers {summary['layer_ids']}\n"
        f"- draft vocabulary: {config['draft_vocab']} tokens (the target's most frequent choices on the data)\n"
        f"- data: `{config['data']}`, {summary['train_tokens']} training tokens "
        f"(at most {config['max_len']} per row), {summary['heldout_examples']} rows held out\n"
        f"- {summary['steps']} optimizer steps ({config['epochs']} epochs, {config['tokens_per_batch']} tokens per "
        f"batch, lr {config['lr']}, seed {config['seed']}), {summary['train_seconds']} s of training\n"
        f"- held-out top-1 accuracy against the target's greedy token: {accuracy}\n"
    )


@torch.no_grad()
def _start_from_target(head: torch.nn.Module, model: torch.nn.Module, vocab: torch.Tensor) -> None:
    """Start the head's output side as the target's own (its head rows for the draft vocabulary, its
    final norm): the head's output is meant to read like a target hidden state, so training starts
    from a head that already maps such states to tokens. Medusa's blocks start at zero (each block
    is then the identity), as in the Medusa paper."""
    rows = model.get_output_embeddings().weight[vocab]
    if isinstance(head, HydraHeads):
        start_as_medusa(head)
    if isinstance(head, MedusaHeads):
        for lm, block in zip(head.lm_heads, head.blocks, strict=True):
            lm.weight.copy_(rows)
            for layer in block.layers:
                layer.weight.zero_()
                layer.bias.zero_()
        return
    head.lm_head.weight.copy_(rows)
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is not None and norm.weight.shape == head.norm.weight.shape:
        head.norm.weight.copy_(norm.weight)


def _checkpoint(path: Path, head: Eagle3Head, optimizer, schedule, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(), **state},
        tmp,
    )
    tmp.replace(path)
