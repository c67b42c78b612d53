"""Build the training text of the shipped draft heads from openly licensed git repositories.

Why a script: a shipped head is only as trustworthy as the data it saw, so the
data is rebuilt from pinned commits of public repositories rather than kept as
a file of unknown origin. Sources (all Apache-2.0):

- yizhongw/self-instruct @ 0b26cca: `data/seed_tasks.jsonl` (175 human-written
  tasks with answers) and `human_eval/user_oriented_instructions.jsonl` (252
  expert-written instructions with answers);
- Open-Assistant/oasst-model-eval @ ce935de:
  `sampling_reports/oasst-sft/1k-prompts/*.json` (human OpenAssistant prompts,
  each with a reply sampled from OpenAssistant's pythia-12b SFT model; the
  first reply of the first sampling setting is used).

Invariants: rows are chats (`{"messages": [...]}`), deduplicated by prompt; no
prompt equals or contains a Spec-Bench question, nor is contained in one (the
benchmark is evaluation data); the output is the same for the same commits.

    python benchmarks/head_data.py --self-instruct GITDIR --oasst GITDIR -o train.jsonl

GITDIR is a bare or normal clone (read with `git show`, so no work tree is needed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

SELF_INSTRUCT = ("0b26cca", ("data/seed_tasks.jsonl", "human_eval/user_oriented_instructions.jsonl"))
OASST = ("ce935de", "sampling_reports/oasst-sft/1k-prompts/")
SPEC_BENCH = Path(__file__).resolve().parent.parent / "src/specdec/datasets/spec_bench/question.jsonl"


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def self_instruct_rows(repo: str) -> list[dict]:
    commit, paths = SELF_INSTRUCT
    rows = []
    for path in paths:
        for line in _git(repo, "show", f"{commit}:{path}").splitlines():
            task = json.loads(line)
            for instance in task["instances"][:1]:
                prompt = task["instruction"] + (f"\n\n{instance['input']}" if instance.get("input") else "")
                if instance.get("output", "").strip():
                    rows.append(_chat(prompt, instance["output"]))
    return rows


def oasst_rows(repo: str) -> list[dict]:
    commit, folder = OASST
    rows = []
    for path in sorted(_git(repo, "ls-tree", "--name-only", f"{commit}:{folder}").split()):
        report = json.loads(_git(repo, "show", f"{commit}:{folder}{path}"))
        for item in report["prompts"]:
            outputs = item["results"][0]["outputs"] if item.get("results") else []
            reply = outputs[0].replace("<|endoftext|>", "").strip() if outputs else ""
            if item.get("prompt", "").strip() and reply:
                rows.append(_chat(item["prompt"], reply))
    return rows


def _chat(prompt: str, reply: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt.strip()}, {"role": "assistant", "content": reply.strip()}]}


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def clean(rows: list[dict]) -> tuple[list[dict], int]:
    """Rows deduplicated by prompt, without any that overlap a Spec-Bench question; (rows, dropped)."""
    questions = [
        _norm(turn) for line in SPEC_BENCH.read_text().splitlines() for turn in json.loads(line)["turns"]
    ]
    seen, out, dropped = set(), [], 0
    for row in rows:
        prompt = _norm(row["messages"][0]["content"])
        if prompt in seen or any(prompt in q or q in prompt for q in questions):
            dropped += 1
            continue
        seen.add(prompt)
        out.append(row)
    return out, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--self-instruct", required=True, help="clone of yizhongw/self-instruct")
    parser.add_argument("--oasst", required=True, help="clone of Open-Assistant/oasst-model-eval")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args()
    rows, dropped = clean(self_instruct_rows(args.self_instruct) + oasst_rows(args.oasst))
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} chats written to {args.out} ({dropped} duplicates or Spec-Bench overlaps dropped)")


if __name__ == "__main__":
    main()
