"""specdec in transformers' `custom_generate/generate.py` layout: `custom_generate=PATH, trust_remote_code=True`.

Why this file exists: transformers loads a folder's `custom_generate/generate.py` and calls its
`generate(model, **generate_arguments)` in place of its own `generate`. This file only forwards
to transformers' `generate` with specdec's decoding callable (`specdec.decoder`), so the string
form and the callable form decode the same way. PATH is the folder holding this one:
`specdec.integrations.custom_generate_path()`.

Extra arguments of the string form: `specdec_method=` (default "logitspec") and
`specdec_options=` (a dict of the method's options, plus tokenizer / attention / pack / exact);
a `tokenizer=` or `streamer=` given to `generate` is handed to specdec too.
"""

from typing import Any

from transformers import GenerationMixin

from specdec.integrations.transformers_generate import decoder


def generate(model: Any, *args: Any, specdec_method: str = "logitspec", specdec_options: dict | None = None,
             **kwargs: Any) -> Any:
    options = dict(specdec_options or {})
    if kwargs.get("tokenizer") is not None:
        options.setdefault("tokenizer", kwargs["tokenizer"])
    if kwargs.get("streamer") is not None:  # transformers hands generate's streamer to no callable
        options.setdefault("streamer", kwargs.pop("streamer"))
    return GenerationMixin.generate(model, *args, custom_generate=decoder(specdec_method, **options), **kwargs)
