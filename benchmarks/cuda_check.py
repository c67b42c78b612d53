"""Does specdec stay lossless on this GPU? Tree logits vs sequential logits, and every method vs plain.

Why: the test suite runs on the CPU (CI has no GPU), but users run on CUDA,
where kernels, SDPA back-ends and reduction orders differ. This script checks
the two things losslessness rests on, on whatever device and model it is given:

1. `TargetModel.forward_tree` over a bushy token tree gives, at every node, the
   logits of a plain forward pass over that node's root-to-node path (max |diff|);
2. greedy decoding with each method is token-identical to `plain` on a few
   prompts (in fp32; in bf16 a near-tie can flip, which is reported, not hidden).

Nothing is asserted: it prints a table and, as the last stdout line, one JSON
document. `--make-tiny DIR` writes a small randomly initialised llama with the
bundled model's tokenizer (for machines that cannot fetch or carry real weights).

    .venv/bin/python benchmarks/cuda_check.py --make-tiny /tmp/tiny     # where the bundled model is installed
    python benchmarks/cuda_check.py /tmp/tiny --device cuda               # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from specdec.backends.torch.target import TargetModel
from specdec.engine.generation import GenerationConfig
from specdec.engine.loop import Engine
from specdec.models import load_model
from specdec.prompts import encode_prompt
from specdec.proposers import parse_method
from specdec.proposers.plain import PlainProposer
from specdec.tree import DraftTree

PROMPTS = (
    "Summarize: the cat sat on the mat. The cat sat on the mat again, and then the cat slept.",
    "Translate to French: good morning, good morning, good night.",
    "List the numbers from one to twenty, separated by commas.",
    "Write a Python function that adds two numbers, then call it twice.",
)
# A bushy tree below the root: (parent index) per node, root first.
TREE_PARENTS = (-1, 0, 0, 0, 1, 1, 2, 4, 4, 6, 7, 3)


def make_tiny(folder: str) -> None:
    """A 2-layer llama with random weights and the bundled SmolLM2 tokenizer, saved as an HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_model("smollm2-135m", dtype="fp32", device="cpu").tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@torch.inference_mode()
def tree_error(loaded, prompt_ids: list[int]) -> float:
    """Max |tree logits - sequential logits| over the nodes of TREE_PARENTS."""
    target = TargetModel(loaded.model)
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, loaded.model.config.vocab_size, (len(TREE_PARENTS),), generator=generator)
    parents = torch.tensor(TREE_PARENTS, dtype=torch.int64)
    target.prefill(prompt_ids)
    tree_logits = target.forward_tree(tokens, parents).float()
    tree = DraftTree(tokens, parents)
    worst = 0.0
    for node in range(tree.num_nodes):
        reference = TargetModel(loaded.model)
        reference.prefill(prompt_ids)
        logits = reference.append(tree.path_tokens(node))[-1].float()
        worst = max(worst, float((tree_logits[node] - logits).abs().max()))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--methods", default="pld,logitspec,logitspec:adaptive=false,lookahead,draft")
    parser.add_argument("--make-tiny", metavar="DIR", help="write a tiny random llama folder and stop")
    args = parser.parse_args(argv)
    if args.make_tiny:
        make_tiny(args.make_tiny)
        print(json.dumps({"written": args.make_tiny}))
        return 0
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    engine = Engine(loaded)
    prompts = [encode_prompt(loaded.tokenizer, p, chat=bool(loaded.tokenizer.chat_template)) for p in PROMPTS]
    report = {"device": str(loaded.device), "dtype": str(loaded.dtype), "model": args.model,
              "torch": torch.__version__, "tree_max_abs_diff": tree_error(loaded, prompts[0]), "methods": {}}
    if loaded.device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(loaded.device)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    plain = [engine.generate(ids, PlainProposer(), config).token_ids for ids in prompts]
    print(f"tree vs sequential logits, max |diff|: {report['tree_max_abs_diff']:.2e}")
    for method in filter(None, args.methods.split(",")):
        spec = f"draft:draft_model={args.model}" if method == "draft" else method
        proposer = parse_method(spec).build(loaded)
        outs = [engine.generate(ids, proposer, config) for ids in prompts]
        same = sum(out.token_ids == ref for out, ref in zip(outs, plain, strict=True))
        mat = sum(out.stats.mat for out in outs) / len(outs)
        report["methods"][method] = {"identical": same, "prompts": len(prompts), "mat": mat}
        print(f"{method:28s} identical to plain on {same}/{len(prompts)} prompts, MAT {mat:.2f}")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
