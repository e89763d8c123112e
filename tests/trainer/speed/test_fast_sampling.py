"""FastSampler: stock `generate`'s results for the settings it implements, stock `generate` for the rest."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import GenerationConfig

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.trainer.speed.fast_sampling import FastSampler, _sample_top_k, custom_generate, unsupported_settings

VOCAB = 300


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = MiniMindConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB
    )
    return MiniMindForCausalLM(config).eval()


@pytest.fixture(scope="module")
def prompts():
    torch.manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (3, 7))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0  # left padding, as TRL and upstream pad prompts
    attention_mask[1, :1] = 0
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


def _config(**kwargs) -> GenerationConfig:
    return GenerationConfig(pad_token_id=0, bos_token_id=1, **kwargs)


@pytest.mark.parametrize(
    "settings",
    [
        dict(max_new_tokens=12, do_sample=False, eos_token_id=2),
        dict(max_new_tokens=12, min_new_tokens=6, do_sample=False, eos_token_id=[2, 17, 42]),
        dict(max_new_tokens=5, do_sample=False, eos_token_id=None),
    ],
)
def test_greedy_equals_stock_generate(model, prompts, settings):
    input_ids, attention_mask = prompts
    config = _config(**settings)
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    got = FastSampler().generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(got, expected)


def test_greedy_stops_early_and_pads_after_eos_like_stock_generate(model, prompts):
    input_ids, attention_mask = prompts
    first = FastSampler().generate(
        model,
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=_config(max_new_tokens=4, do_sample=False),
    )
    eos = [int(first[0, -3]), int(first[1, -2]), int(first[2, -1])]  # tokens each row will emit
    config = _config(max_new_tokens=10, do_sample=False, eos_token_id=eos)
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    got = FastSampler().generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(got, expected)
    assert got.shape[1] < input_ids.shape[1] + 10  # every row finished: the loop stopped early


def test_sampling_shapes_min_new_tokens_and_num_return_sequences(model, prompts):
    input_ids, attention_mask = prompts
    config = _config(
        max_new_tokens=9,
        min_new_tokens=9,
        do_sample=True,
        temperature=0.8,
        top_k=50,
        eos_token_id=list(range(3, VOCAB // 2)),
        num_return_sequences=4,
    )
    torch.manual_seed(0)
    out = FastSampler().generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert out.shape == (12, 7 + 9)
    assert torch.equal(out[:, :7], input_ids.repeat_interleave(4, dim=0))
    # EOS ids are half the vocabulary, yet min_new_tokens kept every one of them out
    assert not torch.isin(out[:, 7:], torch.arange(3, VOCAB // 2)).any()


def test_top_k_draws_follow_the_filtered_softmax():
    torch.manual_seed(0)
    scores = torch.randn(1, 40) * 2
    top_k = 5
    values, indices = scores.topk(top_k)
    expected = torch.zeros(40)
    expected[indices[0]] = values[0].softmax(-1)
    draws = _sample_top_k(scores.expand(20000, -1), top_k)
    frequencies = torch.bincount(draws, minlength=40).float() / draws.numel()
    assert set(draws.unique().tolist()) <= set(indices[0].tolist())
    torch.testing.assert_close(frequencies, expected, atol=0.015, rtol=0)


def test_top_k_keeps_every_token_tied_at_the_kth_score_like_transformers():
    scores = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, -1.0, -2.0]])  # k=3 ties tokens 2, 3, 4
    torch.manual_seed(0)
    draws = _sample_top_k(scores.expand(6000, -1), 3)
    assert set(draws.unique().tolist()) == {0, 1, 2, 3, 4}
    many = torch.tensor([[5.0, 4.0] + [3.0] * 12 + [-1.0, -2.0]])  # more ties than the first pass's margin
    draws = _sample_top_k(many.expand(20000, -1), 3)
    assert set(draws.unique().tolist()) == set(range(14))


def test_top_k_with_ties_in_some_rows_keeps_each_rows_own_candidates():
    """Rows are drawn together among the widest row's candidates (bf16 logits tie often); a row without ties must
    still draw from its own top-k only, with transformers' probabilities."""
    scores = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, -1.0, -2.0], [1.0, 2.0, 3.0, 0.5, 0.4, 0.3, -5.0]])
    torch.manual_seed(0)
    draws = _sample_top_k(scores.repeat_interleave(8000, dim=0), 3).view(2, 8000)
    for row, row_draws in zip(scores, draws, strict=True):
        expected = row.masked_fill(row < row.topk(3).values[-1], float("-inf")).softmax(-1)
        frequencies = torch.bincount(row_draws, minlength=len(row)).float() / len(row_draws)
        torch.testing.assert_close(frequencies, expected, atol=0.015, rtol=0)


@pytest.mark.parametrize(
    "settings",
    [dict(repetition_penalty=1.3), dict(top_p=0.9), dict(min_p=0.1), dict(no_repeat_ngram_size=2)],
)
def test_other_settings_fall_back_to_stock_generate(model, prompts, settings):
    input_ids, attention_mask = prompts
    config = _config(max_new_tokens=6, do_sample=True, top_k=20, eos_token_id=2, **settings)
    prepared, _ = model._prepare_generation_config(config)
    assert unsupported_settings(prepared)
    torch.manual_seed(3)
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    torch.manual_seed(3)
    got = FastSampler().generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(got, expected)


def test_trl_generation_settings_are_supported(model):
    # what TRL's GRPOTrainer builds (transformers path), plus the benchmark's forced length
    config = GenerationConfig(
        max_new_tokens=16,
        do_sample=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=[2],
        temperature=0.8,
        top_p=1.0,
        top_k=50,
        min_p=None,
        repetition_penalty=1.0,
        cache_implementation=None,
        min_new_tokens=16,
        disable_compile=True,
    )
    prepared, _ = model._prepare_generation_config(config)
    assert unsupported_settings(prepared) == []


def test_bf16_weights_decode_with_a_refreshed_copy_and_leave_the_model_alone(model, prompts):
    input_ids, attention_mask = prompts
    config = _config(max_new_tokens=6, do_sample=False, eos_token_id=None)
    sampler = FastSampler(weights_dtype=torch.bfloat16)
    reference = MiniMindForCausalLM(model.config).eval()
    reference.load_state_dict(model.state_dict())
    for parameter in reference.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)
    got = sampler.generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(
        got, reference.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())

    # a changed policy is picked up on the next call
    with torch.no_grad():
        model.lm_head.weight.mul_(-1)
    try:
        got = sampler.generate(model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        with torch.no_grad():
            reference.lm_head.weight.copy_(model.lm_head.weight)
        expected = reference.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        assert torch.equal(got, expected)
    finally:
        with torch.no_grad():
            model.lm_head.weight.mul_(-1)


def test_patch_routes_model_generate_and_restores_it(model, prompts):
    input_ids, attention_mask = prompts
    config = _config(max_new_tokens=5, do_sample=False, eos_token_id=None)
    sampler = FastSampler()
    calls = []
    original = sampler._sample
    sampler._sample = lambda *args: calls.append(1) or original(*args)
    with sampler.patch(model):
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert calls == [1]
    assert "generate" not in model.__dict__
    assert torch.equal(
        out, model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    )


def test_training_wrappers_on_forward_are_bypassed_while_decoding_and_restored(model, prompts):
    input_ids, attention_mask = prompts
    config = _config(max_new_tokens=4, do_sample=False, eos_token_id=None)
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    calls = []

    def wrapper(*args, **kwargs):  # stands for accelerate's autocast wrapper / TRL's fused head
        calls.append(1)
        return type(model).forward(model, *args, **kwargs)

    model.forward = wrapper
    try:
        got = FastSampler().generate(
            model, input_ids=input_ids, attention_mask=attention_mask, generation_config=config
        )
        assert model.forward is wrapper
    finally:
        del model.forward
    assert calls == [] and torch.equal(got, expected)


def test_peft_model_decodes_with_its_adapters(model, prompts):
    peft = pytest.importorskip("peft")
    input_ids, attention_mask = prompts
    lora = peft.get_peft_model(
        MiniMindForCausalLM(model.config),
        peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    config = _config(max_new_tokens=8, do_sample=False, eos_token_id=None)
    expected = lora.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    with FastSampler().patch(lora):
        got = lora.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    assert torch.equal(got, expected)
    with lora.disable_adapter():  # the adapters really change the tokens, so the check above means something
        assert not torch.equal(
            lora.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config), expected
        )


# --- what the sampler samples: first-token frequencies against the tempered top-k softmax ---------------

# Dvoretzky-Kiefer-Wolfowitz: the empirical CDF of n draws strays further than sqrt(ln(2 / a) / 2n) from the
# true CDF with probability below a, whatever the distribution (discrete ones included).


class FixedLogits(torch.nn.Module):
    """A stand-in decoder whose next-token logits are the same fixed vector for every row and step, so the
    sampler's own arithmetic (temperature, top-k, the draw) is all that decides the tokens."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.config = MiniMindConfig(vocab_size=logits.numel(), hidden_size=8, num_attention_heads=2)
        self.register_buffer("logits", logits.float())

    def forward(self, input_ids, **kwargs):
        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], 1, -1))


def fixed_logits() -> torch.Tensor:
    """Logits spread like a trained model's next-token distribution (top token ~0.1-0.3)."""
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)).double() * 1.6


def tempered_top_k(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """The distribution `generate` samples from: softmax(logits / T) over the top-k tokens (ties kept)."""
    scores = logits / temperature
    if top_k:
        scores = scores.masked_fill(scores < scores.topk(top_k).values[-1], float("-inf"))
    return scores.softmax(-1)


def cdf_distance(probabilities: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest gap between the two CDFs over the tokens in the reference's order (most likely first)."""
    order = reference.argsort(descending=True, stable=True)
    return (probabilities[order].cumsum(0) - reference[order].cumsum(0)).abs().max().item()


def assert_draws_follow(tokens: torch.Tensor, expected: torch.Tensor, logits, temperature, top_k) -> None:
    """The first tokens' empirical CDF within DKW's bound of `expected`, which the wrong distributions (no
    temperature, no top-k cut) miss by more than three times that bound."""
    tolerance = (math.log(2 / 1e-6) / (2 * tokens.numel())) ** 0.5  # exceeded with probability < 1e-6
    assert cdf_distance(tempered_top_k(logits, 1.0, top_k), expected) > 3 * tolerance
    if top_k:
        assert cdf_distance(tempered_top_k(logits, temperature, 0), expected) > 3 * tolerance
    frequencies = torch.bincount(tokens, minlength=expected.numel()).double() / tokens.numel()
    assert not frequencies[expected == 0].any()  # nothing outside the top k is ever drawn
    assert cdf_distance(frequencies, expected) <= tolerance


def _sampling_config(temperature, top_k, draws):
    return _config(
        max_new_tokens=1, do_sample=True, temperature=temperature, top_k=top_k, eos_token_id=None,
        num_return_sequences=draws,
    )  # fmt: skip


@pytest.mark.parametrize("top_k", [0, 50])
@pytest.mark.parametrize("temperature", [0.8, 1.3])
def test_sampled_tokens_follow_the_tempered_top_k_distribution(temperature, top_k):
    logits = fixed_logits()
    decoder = FixedLogits(logits)
    prompt = torch.tensor([[5, 6, 7]])
    torch.manual_seed(5)
    out = FastSampler()._sample(decoder, prompt, None, _sampling_config(temperature, top_k, 50_000))
    assert out.shape == (50_000, 4)
    assert_draws_follow(out[:, -1], tempered_top_k(logits, temperature, top_k), logits, temperature, top_k)


def test_generate_through_a_real_model_samples_the_tempered_top_k_distribution(model):
    """End to end: `generate` on a MiniMind, whose last-position logits give the expected distribution."""
    spread = MiniMindForCausalLM(model.config).eval()
    spread.load_state_dict(model.state_dict())
    with torch.no_grad():
        spread.model.norm.weight.fill_(6.0)  # logits spread like a trained model's, not a random one's
        prompt = torch.randint(3, VOCAB, (1, 7), generator=torch.Generator().manual_seed(5))
        logits = spread(prompt).logits[0, -1].double()
    torch.manual_seed(5)
    out = FastSampler().generate(spread, input_ids=prompt, generation_config=_sampling_config(0.8, 50, 5_000))
    assert out.shape == (5_000, 8) and torch.equal(out[:, :7], prompt.expand(5_000, -1))
    assert_draws_follow(out[:, -1], tempered_top_k(logits, 0.8, 50), logits, 0.8, 50)


# --- stepping aside for a `generate` that is not transformers' own -----------------------------------------


def _greedy(model, prompts):
    input_ids, attention_mask = prompts
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        generation_config=_config(max_new_tokens=3, do_sample=False, eos_token_id=None),
    )


def test_a_generate_patched_on_the_instance_is_called_and_named_once(model, prompts, caplog):
    """`patch.object(model, "generate")` (how TRL's tool tests inject completions) inside the sampler's patch: the
    mock runs, nothing raises "already patched", and the log says why once however often the block is entered."""
    from unittest.mock import patch

    sampler = FastSampler()
    sampler._sample = lambda *args: pytest.fail("the lean loop ran instead of the patched generate")
    injected = torch.zeros(3, 9, dtype=torch.long)
    with patch.object(model, "generate", return_value=injected) as fake, caplog.at_level("WARNING"):
        for _ in range(2):
            with sampler.patch(model):
                assert model.generate(**_greedy(model, prompts)) is injected
    assert fake.call_count == 2 and "generate" not in model.__dict__
    said = [r.getMessage() for r in caplog.records if "lean sampler steps aside" in r.getMessage()]
    assert said == ["the lean sampler steps aside: MiniMindForCausalLM.generate is set on the instance, so rollouts "
                    "call that generate"]  # fmt: skip


def test_a_subclass_generate_is_called(model, prompts):
    calls = []

    class CustomGenerate(MiniMindForCausalLM):
        def generate(self, *args, **kwargs):
            calls.append(1)
            return super().generate(*args, **kwargs)

    custom = CustomGenerate(model.config).eval()
    custom.load_state_dict(model.state_dict())
    sampler = FastSampler()
    sampler._sample = lambda *args: pytest.fail("the lean loop ran instead of the subclass's generate")
    with sampler.patch(custom):
        got = custom.generate(**_greedy(custom, prompts))
    assert calls == [1] and torch.equal(got, model.generate(**_greedy(model, prompts)))


def test_a_patched_generation_mixin_generate_is_called(model, prompts):
    """A test (or a library) replacing transformers' `GenerationMixin.generate` itself."""
    from unittest.mock import patch

    sampler = FastSampler()
    sampler._sample = lambda *args: pytest.fail("the lean loop ran instead of the patched GenerationMixin.generate")
    with patch("transformers.generation.utils.GenerationMixin.generate", return_value="patched") as fake:
        with sampler.patch(model):
            assert model.generate(**_greedy(model, prompts)) == "patched"
    assert fake.call_count == 1


def test_peft_prompt_learning_generates_through_peft(model, prompts):
    """Prompt tuning prepends its virtual tokens in PEFT's own `generate`; LoRA adapters keep the lean loop (above)."""
    peft = pytest.importorskip("peft")
    tuned = peft.get_peft_model(
        MiniMindForCausalLM(model.config), peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    ).eval()
    sampler = FastSampler()
    sampler._sample = lambda *args: pytest.fail("the lean loop ran for a prompt-tuned model")
    expected = tuned.generate(**_greedy(tuned, prompts))
    with sampler.patch(tuned):
        assert torch.equal(tuned.generate(**_greedy(tuned, prompts)), expected)
    assert custom_generate(tuned) == "PEFT PROMPT_TUNING generates through PEFT's own generate"


def test_stock_generate_keeps_the_lean_loop(model):
    """transformers' own `generate`, also under a LoRA adapter (PEFT's `generate` runs the base model's)."""
    peft = pytest.importorskip("peft")
    assert custom_generate(model) is None
    lora = peft.get_peft_model(MiniMindForCausalLM(model.config), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert custom_generate(lora) is None
