"""The target's own greedy replies to the prompts of a chat file: training text for draft heads.

Why: a head drafts for the target's text, so it learns best from the target's text (self-distillation, as
EAGLE and Medusa-2 train). The shipped heads first learned from human and pythia-12b replies with the
target's greedy token as the label; here the reply itself is the target's, so the states a head reads in
training are the ones it reads when drafting.

    .venv/bin/python benchmarks/self_distill.py train.jsonl -o replies.jsonl [--max-new-tokens 384]

Each row of the input is a chat (`{"messages": [...]}`, `benchmarks/head_data.py`); its prompt is every
message before the last assistant reply, rendered with the model's chat template. Each output row is
`{"input_ids": prompt + reply}`, which `specdec-hf train --data` reads as it is.

Invariants: the replies are what `specdec.generate` gives with `method="plain"`, greedy, on the model as
loaded by default (the path users decode on); rows keep the input's order; the output is appended batch by
batch, so a stopped run resumes after the last written row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

import specdec
from specdec.models import load_model
from specdec.prompts import encode_prompt


def prompts(path: Path) -> list[list[dict]]:
    """Each chat's messages before its last assistant reply."""
    chats = []
    for line in path.read_text(encoding="utf-8").splitlines():
        messages = json.loads(line)["messages"]
        while messages and messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        chats.append(messages)
    return chats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="chats, one JSON object a line")
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are skipped")
    parser.add_argument("--batch", type=int, default=16, help="prompts decoded together")
    args = parser.parse_args()

    chats = prompts(args.data)
    done = len(args.out.read_text().splitlines()) if args.out.exists() else 0
    model = load_model(args.model)
    tokenizer = model.tokenizer
    bar = tqdm(total=len(chats), initial=done, unit="chat", desc="replies", dynamic_ncols=True)
    for start in range(done, len(chats), args.batch):
        batch = chats[start : start + args.batch]
        ids = [encode_prompt(tokenizer, messages) for messages in batch]
        keep = [k for k, i in enumerate(ids) if len(i) <= args.max_prompt_tokens]
        outputs = specdec.generate(model, [batch[k] for k in keep], max_new_tokens=args.max_new_tokens,
                                   max_batch=args.batch) if keep else []
        rows = {k: ids[k] + list(out.token_ids) for k, out in zip(keep, outputs, strict=True)}
        with args.out.open("a", encoding="utf-8") as f:
            for k in range(len(batch)):  # one line per input row, so resuming counts lines
                f.write(json.dumps({"input_ids": rows[k]} if k in rows else {"skipped": True}) + "\n")
        bar.update(len(batch))
    bar.close()


if __name__ == "__main__":
    main()
