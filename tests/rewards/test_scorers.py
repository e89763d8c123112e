"""Scorers with real (tiny) transformer reward models: batched scoring equals one-at-a-time scoring."""

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from minimind_trl.models.internlm2_reward import build_internlm2_tokenizer, load_internlm2_reward_model, load_internlm2_tokenizer
from minimind_trl.models.internlm2_reward.tiny import TINY_REWARD_TOKEN_ID, tiny_tokenizer_config, write_tiny_internlm2_reward_model
from minimind_trl.rewards import RewardModelReward
from minimind_trl.rewards import InternLM2Scorer, SequenceClassifierScorer
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "Paris."}],
    [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "中国的首都是哪里？"},
        {"role": "assistant", "content": "<think>\n想一想\n</think>\n<answer>\n北京\n</answer>"},
    ],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}],
    [
        {"role": "user", "content": "Explain why the sky is blue, step by step, in some detail please."},
        {"role": "assistant", "content": "Sunlight is scattered by the air and blue light scatters the most. " * 3},
    ],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  spaced  out  "}],
]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return write_tiny_internlm2_reward_model(tmp_path_factory.mktemp("scorer") / "tiny")


@pytest.fixture(scope="module")
def reward_model(tiny_folder):
    return load_internlm2_reward_model(tiny_folder)


@pytest.fixture(scope="module")
def reward_tokenizer(tiny_folder):
    return load_internlm2_tokenizer(tiny_folder)


class CountingModel(torch.nn.Module):
    """Wraps a reward model and counts forward passes."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.config = model.config
        self.forward_calls = 0

    def forward(self, **kwargs):
        self.forward_calls += 1
        return self.inner(**kwargs)


def direct_scores(model, sequences):
    with torch.no_grad():
        return [float(model(input_ids=torch.tensor([ids])).logits[0, 0]) for ids in sequences]


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_internlm2_batched_equals_one_at_a_time(reward_model, reward_tokenizer, padding_side):
    conversations = CONVERSATIONS * 2
    single = InternLM2Scorer(reward_model, reward_tokenizer, batch_size=1).score(conversations)
    for batch_size in (3, 16):
        batched = InternLM2Scorer(reward_model, reward_tokenizer, batch_size=batch_size, padding_side=padding_side)
        torch.testing.assert_close(batched.score(conversations), single, rtol=1e-5, atol=1e-5)
    scorer = InternLM2Scorer(reward_model, reward_tokenizer)
    torch.testing.assert_close(single, direct_scores(reward_model, [scorer.token_ids(c) for c in conversations]), rtol=1e-5, atol=1e-5)
    assert len({round(s, 4) for s in single[: len(CONVERSATIONS)]}) == len(CONVERSATIONS)


def test_internlm2_token_ids_end_with_one_reward_token(tiny_folder, reward_model, reward_tokenizer):
    """The published template ends with <|reward|>; without it the scorer appends the token itself."""
    with_reward = InternLM2Scorer(reward_model, reward_tokenizer)
    plain_tokenizer = build_internlm2_tokenizer(tiny_folder / "tokenizer.model", tiny_tokenizer_config(reward_in_template=False))
    without_reward = InternLM2Scorer(reward_model, plain_tokenizer)
    for conversation in CONVERSATIONS:
        ids = with_reward.token_ids(conversation)
        assert ids == without_reward.token_ids(conversation)
        assert ids[0] == reward_tokenizer.bos_token_id and ids[1:].count(reward_tokenizer.bos_token_id) == 0
        assert ids[-1] == TINY_REWARD_TOKEN_ID and ids.count(TINY_REWARD_TOKEN_ID) == 1
    torch.testing.assert_close(without_reward.score(CONVERSATIONS), with_reward.score(CONVERSATIONS))


def test_internlm2_scorer_runs_ceil_n_over_batch_size_forwards(reward_model, reward_tokenizer):
    counting = CountingModel(reward_model)
    scores = InternLM2Scorer(counting, reward_tokenizer, batch_size=2).score(CONVERSATIONS)
    assert counting.forward_calls == math.ceil(len(CONVERSATIONS) / 2) and len(scores) == len(CONVERSATIONS)
    assert InternLM2Scorer(counting, reward_tokenizer).score([]) == []


def test_reward_model_reward_with_internlm2_equals_the_seed_loop(reward_model, reward_tokenizer):
    """Upstream called `reward_model.get_score(tokenizer, messages)` once or twice per completion."""
    policy_tokenizer = build_minimind_tokenizer()
    prompts = [[{"role": "user", "content": "中国的首都是哪里？"}], [{"role": "user", "content": "What is 2 + 3?"}]]
    completions = [
        "<think>\nthe capital\n</think>\n<answer>\n北京\n</answer>",
        "北京",
        "<think>\nadd\n</think>\n\n<answer>\n5\n</answer>",
        "<answer>  five </answer> and more text",
    ]
    trl_prompts = [prompts[0], prompts[0], prompts[1], prompts[1]]
    counting = CountingModel(reward_model)
    reward = RewardModelReward(InternLM2Scorer(counting, reward_tokenizer, batch_size=16), tokenizer=policy_tokenizer)
    rewards = reward(trl_prompts, [[{"role": "assistant", "content": c}] for c in completions])
    assert counting.forward_calls == 1  # 4 full + 3 answer-only conversations in one batch

    expected = []
    for prompt, completion in zip(trl_prompts, completions):
        rendered = policy_tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        messages = reward.prompt_turns(rendered)
        score = max(min(reward_model.get_score(reward_tokenizer, messages + [{"role": "assistant", "content": completion}]), 3.0), -3.0)
        if "<answer>" in completion:
            answer = completion.split("<answer>")[1].split("</answer>")[0].strip()
            answer_score = reward_model.get_score(reward_tokenizer, messages + [{"role": "assistant", "content": answer}])
            score = score * 0.4 + max(min(answer_score, 3.0), -3.0) * 0.6
        expected.append(score)
    torch.testing.assert_close(rewards, expected, rtol=1e-5, atol=1e-5)


def test_get_score_only_models_are_scored_one_by_one(reward_tokenizer):
    class RemoteCodeLike:
        """Stands in for the published remote-code model: only `get_score(tokenizer, messages)`."""

        def __init__(self):
            self.calls = []

        def get_score(self, tokenizer, messages):
            assert tokenizer is reward_tokenizer
            self.calls.append(messages)
            return float(len(messages[-1]["content"]))

    model = RemoteCodeLike()
    scorer = InternLM2Scorer(model, reward_tokenizer, batch_size=4)
    assert scorer.score(CONVERSATIONS) == [float(len(c[-1]["content"])) for c in CONVERSATIONS]
    assert model.calls == CONVERSATIONS
    with pytest.raises(TypeError, match="reward_token_id"):
        InternLM2Scorer(object(), reward_tokenizer)


def test_from_pretrained_and_model_get_score(tiny_folder, reward_model, reward_tokenizer):
    scorer = InternLM2Scorer.from_pretrained(tiny_folder, batch_size=4)
    expected = InternLM2Scorer(reward_model, reward_tokenizer).score(CONVERSATIONS)
    torch.testing.assert_close(scorer.score(CONVERSATIONS), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reward_model.get_score(reward_tokenizer, CONVERSATIONS[1]), expected[1], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------------------------
# Sequence-classification reward models.


@pytest.fixture(scope="module")
def classifier():
    tokenizer = build_minimind_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id, max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return LlamaForSequenceClassification(config).eval(), tokenizer


def test_sequence_classifier_batched_equals_one_at_a_time(classifier):
    model, tokenizer = classifier
    conversations = CONVERSATIONS * 2
    single = SequenceClassifierScorer(model, tokenizer, batch_size=1).score(conversations)
    batched = SequenceClassifierScorer(model, tokenizer, batch_size=4).score(conversations)
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5)
    text = tokenizer.apply_chat_template(conversations[1], tokenize=False)
    with torch.no_grad():
        direct = model(**tokenizer(text, add_special_tokens=False, return_tensors="pt")).logits[0, 0]
    torch.testing.assert_close(single[1], float(direct), rtol=1e-5, atol=1e-6)
    assert len({round(s, 4) for s in single[: len(CONVERSATIONS)]}) == len(CONVERSATIONS)


def test_sequence_classifier_scorer_checks_the_model(classifier):
    model, tokenizer = classifier
    two_labels = LlamaForSequenceClassification(
        LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_labels=2, pad_token_id=0)
    )
    with pytest.raises(ValueError, match="num_labels=1"):
        SequenceClassifierScorer(two_labels, tokenizer)
    no_pad = LlamaForSequenceClassification(
        LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_labels=1, pad_token_id=None)
    )
    with pytest.raises(ValueError, match="pad"):
        SequenceClassifierScorer(no_pad, tokenizer)
    no_template = build_minimind_tokenizer()
    no_template.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        SequenceClassifierScorer(model, no_template)


def test_sequence_classifier_from_pretrained(tmp_path, classifier):
    model, tokenizer = classifier
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    loaded = SequenceClassifierScorer.from_pretrained(tmp_path / "rm", batch_size=3)
    assert not loaded.model.training and loaded.model.dtype == torch.float32
    expected = SequenceClassifierScorer(model, tokenizer).score(CONVERSATIONS)
    torch.testing.assert_close(loaded.score(CONVERSATIONS), expected, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- inputs past the model's positions


LONG_PROMPT = "The history of the world, told at length. " * 1200  # ~50 KB of text


def test_an_outlier_prompt_is_cut_to_the_reward_models_positions_and_warned_once(reward_model, reward_tokenizer,
                                                                                  caplog):  # fmt: skip
    """Each generation's reward term keeps its completion: MiniMind2's whole conversation and MiniMind-3's folded
    question lose their oldest text, as upstream cuts the policy's prompt, and are scored within 512 positions."""
    from minimind_trl.rewards.minimind3_rewards import AnswerRewardModelReward

    scorer = InternLM2Scorer(reward_model, reward_tokenizer)
    limit = reward_model.config.max_position_embeddings
    long_chat = [{"role": "user", "content": LONG_PROMPT}, {"role": "assistant", "content": "Paris."}]
    full = scorer.token_ids(long_chat)
    assert len(full) > 8 * limit
    with caplog.at_level("WARNING", logger="minimind_trl.rewards.scorers"):
        got = scorer.score([long_chat, CONVERSATIONS[0]])
        prompts = [[{"role": "user", "content": LONG_PROMPT}]] * 2
        completions = [[{"role": "assistant", "content": "<think>\nhm\n</think>\n<answer>\nParis\n</answer>"}]] * 2
        seed_term = RewardModelReward(scorer, tokenizer=build_minimind_tokenizer(), clip=100.0)(prompts, completions)
        minimind3_term = AnswerRewardModelReward(scorer, tokenizer=build_minimind_tokenizer(), clip=100.0)(
            prompts, completions
        )
    assert direct_scores(reward_model, [full[-limit:]])[0] == pytest.approx(got[0], abs=1e-5)
    assert full[-limit:][-1] == TINY_REWARD_TOKEN_ID  # the reward token is read where the model was trained
    assert got[1] == pytest.approx(scorer.score([CONVERSATIONS[0]])[0], abs=1e-6)  # short rows untouched
    assert all(math.isfinite(value) for value in seed_term + minimind3_term)
    warnings = [record.message for record in caplog.records if "positions" in record.message]
    assert len(warnings) == 1 and f"reward model's {limit} positions" in warnings[0], warnings


def test_a_sequence_classifier_keeps_the_last_tokens_of_a_long_conversation(classifier, caplog):
    model, tokenizer = classifier
    long_chat = [{"role": "user", "content": LONG_PROMPT[:6000]}, {"role": "assistant", "content": "Paris."}]
    ids = tokenizer(tokenizer.apply_chat_template(long_chat, tokenize=False), add_special_tokens=False)["input_ids"]
    assert len(ids) > model.config.max_position_embeddings
    with caplog.at_level("WARNING", logger="minimind_trl.rewards.scorers"):
        got = SequenceClassifierScorer(model, tokenizer, max_length=64).score([long_chat])
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids[-64:]])).logits[0, 0]
    assert got[0] == pytest.approx(float(expected), abs=1e-5)
    assert any("last 64 tokens" in record.message for record in caplog.records)
