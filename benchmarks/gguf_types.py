"""What `pack auto` makes of a GGUF of each type: the bundled SmolLM2 file re-written with its decoder products
in another type (Q4_0, Q5_0, Q8_0, Q5_1, F16; everything else copied), each loaded as a user's .gguf file.

For each type: the decoder products a kernel holds as stored and those re-quantized to 4 bits (moved), what
`pack auto` settled and why, and plain decoding's tokens/s on one prompt (64 tokens: a rough rate, not a benchmark) beside the same file under
`--pack int4` (the 4-bit copy) and `--pack off`. Usage: python benchmarks/gguf_types.py [OUT_DIR] [TYPES...]
(files, the conversion caches and a JSON line per type go under OUT_DIR; default a temporary folder).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import gguf
import numpy as np

from specdec.backends.registry import explain
from specdec.backends.torch.gguf_blocks import LAYER_TENSORS
from specdec.backends.torch.packed import pack_of, rounded_products, verify_model
from specdec.models import load_model
from specdec.models.gguf import bundled_gguf_path

PRODUCTS = {f".{name}.weight" for name in LAYER_TENSORS.values()}
PROMPT = "Write a short Python function that returns the n-th Fibonacci number, then explain it."


def rewrite(source: Path, target: Path, kind: str) -> None:
    """`source` with its decoder products re-quantized to `kind` from their values (other tensors copied)."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        name, raw, stored = tensor.name, tensor.data, tensor.tensor_type
        if name.startswith("blk.") and name[name.index(".", 4):] in PRODUCTS:
            values = gguf.quants.dequantize(raw, stored).astype(np.float32)
            stored = gguf.GGMLQuantizationType[kind]
            raw = values.astype(np.float16) if kind == "F16" else gguf.quants.quantize(values, stored)
        writer.add_tensor(name, raw, raw_shape=None, raw_dtype=stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def plain_rate(path: Path, cache: Path, pack: str) -> float:
    """Plain decoding's tokens/s (64 new tokens, after a warm-up), under `pack`."""
    from specdec import generate

    loaded = load_model(str(path), dtype="bf16", cache_dir=cache, pack=pack)
    generate(loaded, PROMPT, max_new_tokens=8, chat=True)
    start = time.perf_counter()
    generate(loaded, PROMPT, max_new_tokens=64, chat=True)
    return 64 / (time.perf_counter() - start)


def main(out: Path, kinds: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        path = out / f"smollm2-{kind.lower()}.gguf"
        if not path.exists():
            rewrite(bundled_gguf_path(), path, kind)
        loaded = load_model(str(path), dtype="bf16", cache_dir=out / "cache")
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            int4_view = verify_model(load_model(str(path), dtype="bf16", cache_dir=out / "cache", pack="int4"))
        moved, total = rounded_products(int4_view)
        row = {"type": kind, "pack_auto": pack_of(loaded), "why": explain(loaded)["pack"],
               "int4_products_moved": moved, "int4_products": total}
        for pack in ("auto", "int4", "off"):
            row[f"plain_tok_s_{pack}"] = round(plain_rate(path, out / "cache", pack), 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    folder = Path(arguments.pop(0)) if arguments and not arguments[0].isupper() else Path(tempfile.mkdtemp())
    main(folder, arguments or ["Q4_0", "Q5_0", "Q8_0", "Q5_1", "F16"])
