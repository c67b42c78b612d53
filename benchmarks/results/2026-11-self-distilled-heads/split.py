"""The learning curve's data files from the chats and SmolLM2's own replies to their prompts.

    python split.py train.jsonl replies.jsonl OUT_DIR

Every file ends with the same 66 self-distilled rows (the last usable replies), held out by
`--holdout 65.5/rows`: `d25`, `d50`, `d100` take the first quarter, half and all of the other replies;
`dmix` puts the human replies of every chat before the held-out ones in front of `d100`.
"""

import json
import sys
from pathlib import Path

HELD_OUT = 66

chats_path, replies_path, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
replies = Path(replies_path).read_text().splitlines()
chats = Path(chats_path).read_text().splitlines()
assert len(replies) == len(chats), "replies.jsonl answers train.jsonl row for row"
usable = [i for i, line in enumerate(replies) if len(json.loads(line).get("input_ids", [])) >= 8]
held, train = usable[-HELD_OUT:], usable[:-HELD_OUT]


def write(name: str, lines: list[str]) -> None:
    (out / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
    print(f"{name}: {len(lines)} rows, --holdout {(HELD_OUT - 0.5) / len(lines)}")


for share, name in ((0.25, "d25"), (0.5, "d50"), (1.0, "d100")):
    write(name, [replies[i] for i in train[: int(len(train) * share)] + held])
write("dmix", chats[: held[0]] + [replies[i] for i in train + held])
