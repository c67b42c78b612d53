"""`model.generate(custom_generate=specdec.decoder(...))` gives what plain `model.generate` gives.

Why: a transformers user changes one argument and must get the same tokens (fp32
greedy), the same return types, the same stopping and the same streamed text;
seeded sampling must equal `specdec.generate` with the same seed. Real models:
the bundled SmolLM2 (llama) and a tiny random Qwen2 over its tokenizer.
"""

from __future__ import annotations

import pytest
import torch
from helpers import save_fixed_costs
from transformers import (
    Qwen2Config,
    Qwen2ForCausalLM,
    StoppingCriteria,
    StoppingCriteriaList,
    TextStreamer,
)
from transformers.generation import GenerateDecoderOnlyOutput

import specdec
from specdec.engine.loop import Engine
from specdec.integrations import custom_generate_path
from specdec.models import load_model

PROMPT = "def fib(n):\n    "
PROMPTS = ["The capital of France is", "List three colours: red, green,"]
FAST = dict(attention="sdpa", pack="off", exact="off", floor=False)  # no per-machine measurement in tests
ALL_METHODS = ["plain", "pld", "logitspec", "recycle", "lookahead", "session", "eagle", "medusa"]


@pytest.fixture(scope="module")
def hf(default_model):
    """The bundled model (fp32) and its tokenizer, as a transformers user holds them. The decoders wrap the
    model under its folder's name, a cost key of its own: its cache gets the suite's fixed curve too, or
    the planners' trees would follow a curve measured under the suite's load (every step plain, once)."""
    model, tok = default_model.model, default_model.tokenizer
    save_fixed_costs(load_model(model, tokenizer=tok, pack=FAST["pack"], exact=FAST["exact"]))
    return model, tok


@pytest.fixture(scope="module")
def tiny_qwen(default_model):
    config = Qwen2Config(
        vocab_size=len(default_model.tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(3)
    return Qwen2ForCausalLM(config).eval()


def _both(model, tok, method: str, prompt: str = PROMPT, **kwargs):
    inputs = tok([prompt], return_tensors="pt")
    plain = model.generate(**inputs, do_sample=False, **kwargs)
    ours = model.generate(**inputs, do_sample=False, custom_generate=specdec.decoder(method, tokenizer=tok, **FAST),
                          **kwargs)  # fmt: skip
    return plain, ours


def test_greedy_identical_to_generate_logitspec(hf):
    model, tok = hf
    plain, ours = _both(model, tok, "logitspec", max_new_tokens=32, return_dict_in_generate=True)
    assert isinstance(ours, GenerateDecoderOnlyOutput)
    assert torch.equal(ours.sequences, plain.sequences)
    assert ours.stats[0].num_decode_steps < 31  # it speculated: fewer passes than tokens


def test_greedy_identical_on_a_second_architecture(hf, tiny_qwen):
    _, tok = hf
    plain, ours = _both(tiny_qwen, tok, "pld", prompt="one two three one two three one two", max_new_tokens=24)
    assert torch.equal(ours, plain)


@pytest.fixture(scope="module")
def generated_40(hf) -> torch.Tensor:
    """transformers' own greedy `generate` on PROMPT, 40 tokens: once for every method below."""
    model, tok = hf
    return model.generate(**tok([PROMPT], return_tensors="pt"), do_sample=False, max_new_tokens=40)


@pytest.mark.slow
@pytest.mark.parametrize("method", ALL_METHODS)
def test_greedy_identical_every_method(hf, generated_40, method):
    model, tok = hf
    ours = model.generate(**tok([PROMPT], return_tensors="pt"), do_sample=False, max_new_tokens=40,
                          custom_generate=specdec.decoder(method, tokenizer=tok, **FAST))  # fmt: skip
    assert torch.equal(ours, generated_40)


def test_eos_and_user_stopping_criteria_stop_where_generate_stops(hf):
    model, tok = hf
    full, _ = _both(model, tok, "logitspec", max_new_tokens=24)
    length = full.shape[1] - len(tok(PROMPT).input_ids)
    eos = int(full[0, -length + 5])  # a token the reply emits at its 6th position
    plain, ours = _both(model, tok, "logitspec", max_new_tokens=24, eos_token_id=eos)
    assert torch.equal(ours, plain) and ours.shape[1] < full.shape[1]

    class AtLength(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= full.shape[1] - 10, dtype=torch.bool)

    plain, ours = _both(model, tok, "pld", max_new_tokens=24, stopping_criteria=StoppingCriteriaList([AtLength()]))
    assert torch.equal(ours, plain) and ours.shape[1] == full.shape[1] - 10


def test_seeded_sampling_equals_specdec_generate(hf):
    model, tok = hf
    sampling = dict(temperature=0.8, top_k=20, top_p=0.9)
    inputs = tok([PROMPT], return_tensors="pt")
    dec = specdec.decoder("logitspec", tokenizer=tok, **FAST)
    ours = model.generate(**inputs, do_sample=True, max_new_tokens=24, custom_generate=dec, seed=7, **sampling)
    again = model.generate(**inputs, do_sample=True, max_new_tokens=24, custom_generate=dec, seed=7, **sampling)
    engine = Engine(load_model(model, tokenizer=tok, pack="off", exact="off"), attention="sdpa")
    direct = specdec.generate(engine, PROMPT, "logitspec", max_new_tokens=24, seed=7, **sampling)
    assert ours[0, inputs.input_ids.shape[1]:].tolist() == direct.token_ids
    assert torch.equal(ours, again)


def test_generator_seeds_the_rows(hf):
    model, tok = hf
    inputs = tok([PROMPT], return_tensors="pt")
    dec = specdec.decoder("pld", tokenizer=tok, **FAST)
    runs = [
        model.generate(**inputs, do_sample=True, max_new_tokens=16, custom_generate=dec,
                       generator=torch.Generator().manual_seed(5))
        for _ in range(2)
    ]  # fmt: skip
    assert torch.equal(runs[0], runs[1])


class Collect(TextStreamer):
    """A TextStreamer that keeps what it would print."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, skip_prompt=True)
        self.text = ""

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.text += text


def test_streamer_sees_the_returned_text(hf):
    model, tok = hf
    inputs = tok([PROMPT], return_tensors="pt")
    plain_stream, ours_stream = Collect(tok), Collect(tok)
    plain = model.generate(**inputs, max_new_tokens=24, do_sample=False, streamer=plain_stream)
    dec = specdec.decoder("logitspec", tokenizer=tok, streamer=ours_stream, **FAST)
    ours = model.generate(**inputs, max_new_tokens=24, do_sample=False, custom_generate=dec)
    assert ours_stream.text == tok.decode(ours[0, inputs.input_ids.shape[1]:])
    assert ours_stream.text == plain_stream.text and torch.equal(ours, plain)


def test_left_padded_batch_matches_generate(hf):
    model, tok = hf
    tok.padding_side = "left"
    inputs = tok(PROMPTS, return_tensors="pt", padding=True)
    assert (inputs.attention_mask == 0).any()
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    dec = specdec.decoder("pld", tokenizer=tok, **FAST)
    ours = model.generate(**inputs, max_new_tokens=16, do_sample=False, custom_generate=dec)
    assert torch.equal(ours, plain)


def test_processors_the_rule_cannot_carry_are_refused_by_name(hf):
    model, tok = hf
    inputs = tok([PROMPT], return_tensors="pt")
    dec = specdec.decoder("pld", tokenizer=tok, **FAST)
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        model.generate(**inputs, max_new_tokens=8, repetition_penalty=1.3, custom_generate=dec)


def test_the_custom_generate_folder(hf):
    model, tok = hf
    inputs = tok([PROMPT], return_tensors="pt")
    plain = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    ours = model.generate(**inputs, max_new_tokens=16, do_sample=False, custom_generate=custom_generate_path(),
                          trust_remote_code=True, specdec_method="pld", specdec_options=dict(tokenizer=tok, **FAST))
    assert torch.equal(ours, plain)
