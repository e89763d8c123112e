"""The reward callables against an independent transcription of upstream's `calculate_rewards`.

`seed_rule_rewards` and `seed_reward_model_scores` below are written from the spec's formulas (upstream's
code path, line by line) and serve as the oracle; the library code is compared with them on hand-written
and random completions.
"""

import json
import random
import re

import pytest
from trl.trainer.utils import get_callable_name

from minimind_trl.rewards import (
    RewardModelReward,
    completion_text,
    format_reward,
    minimind_reward_funcs,
    parse_prompt_turns,
    tag_count_reward,
)
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

# --------------------------------------------------------------------------------------------------------------
# The oracle: upstream's arithmetic, transcribed.


def seed_rule_rewards(responses):
    """format (0.5) + tags (0.25 each), per response, as upstream's `reasoning_model_reward` adds them."""
    pattern = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
    pattern2 = r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$"
    format_rewards = []
    for response in responses:
        if re.match(pattern, response, re.S) or re.match(pattern2, response, re.S):
            format_rewards.append(0.5)
        else:
            format_rewards.append(0.0)

    def mark_num(text):
        reward = 0
        if text.count("<think>") == 1:
            reward += 0.25
        if text.count("</think>") == 1:
            reward += 0.25
        if text.count("<answer>") == 1:
            reward += 0.25
        if text.count("</answer>") == 1:
            reward += 0.25
        return reward

    return format_rewards, [mark_num(response) for response in responses]


def seed_reward_model_scores(prompts, responses, get_score, num_generations, reasoning=True):
    """Upstream's per-completion reward-model loop (prompts are the B rendered prompt strings)."""
    scores = []
    scale = 3.0
    for i in range(len(prompts)):
        for j in range(num_generations):
            response = responses[i * num_generations + j]
            pattern = r"<\|im_start\|>(system|user|assistant)\s+(.*?)<\|im_end\|>"
            matches = re.findall(pattern, prompts[i], re.DOTALL)
            messages = [{"role": role, "content": content.strip()} for role, content in matches]
            tmp_chat = messages + [{"role": "assistant", "content": response}]
            score = get_score(tmp_chat)
            score = max(min(score, scale), -scale)
            if reasoning:
                answer_match = re.search(r"<answer>(.*?)</answer>", response, re.DOTALL)
                if answer_match:
                    answer_content = answer_match.group(1).strip()
                    tmp_chat = messages + [{"role": "assistant", "content": answer_content}]
                    answer_score = get_score(tmp_chat)
                    answer_score = max(min(answer_score, scale), -scale)
                    score = score * 0.4 + answer_score * 0.6
            scores.append(score)
    return scores


# --------------------------------------------------------------------------------------------------------------
# Completions.

HAND_WRITTEN = [
    "<think>\nreason\n</think>\n<answer>\nanswer\n</answer>",  # well-formed
    "<think>\nreason\n</think>\n\n<answer>\nanswer\n</answer>",  # the \n\n variant
    "<think>\nreason\n</think>\n<answer>\nanswer\n</answer>\n",  # one trailing newline: `$` still matches
    "<think>\nreason\n</think>\n<answer>\nanswer\n</answer>\n\n",  # two trailing newlines: no match
    "<think>\nreason\n</think>\n<answer>\nanswer\n</answer> ",  # trailing space
    " <think>\nreason\n</think>\n<answer>\nanswer\n</answer>",  # leading space
    "\n<think>\nreason\n</think>\n<answer>\nanswer\n</answer>",  # leading newline
    "<think>\na\n</think>\n<think>\nb\n</think>\n<answer>\nc\n</answer>",  # duplicated think block
    "<think>\na\n</think>\n<answer>\nb\n</answer>\n<answer>\nc\n</answer>",  # duplicated answer block
    "<think>\nI will use <answer> tags\n</think>\n<answer>\nx\n</answer>",  # tag mentioned inside the thought
    "<think>\nreason\n</think>\nno answer block",  # missing answer tags
    "<answer>\nonly an answer\n</answer>",  # missing think tags
    "<think>\nunclosed thought\n<answer>\nx\n</answer>",  # missing </think>
    "<answer>\nb\n</answer>\n<think>\na\n</think>",  # tags out of order
    "</think>\n<think>\na\n</answer>\n<answer>",  # closing before opening
    "<think>\n\n</think>\n<answer>\n\n</answer>",  # empty blocks
    "<think>\n</think>\n<answer>\n</answer>",  # blocks without inner newline pairs
    "<think>reason</think><answer>answer</answer>",  # no newlines at all
    "<think>\nreason\n</think>\n<answer>\nanswer\n</answer>\nextra text",  # text after the answer
    "<think>\r\nreason\r\n</think>\r\n<answer>\r\nanswer\r\n</answer>",  # CRLF
    "<think>\n多行\n推理\n</think>\n<answer>\n答案是北京。\n</answer>",  # Chinese, multi-line
    "<think>\n我想一想\n</think>\n\n<answer>\n北京\n</answer>\n",  # Chinese, \n\n variant, trailing newline
    "只有中文，没有标签",  # Chinese, no tags
    "<THINK>\nshout\n</THINK>\n<ANSWER>\nx\n</ANSWER>",  # wrong case
    "<think >\nx\n</think >\n<answer >\ny\n</answer >",  # spaced tags
    "",  # empty
    "   ",  # whitespace only
    "\n",  # newline only
    "<think>",  # a lone tag
    "<think>\nreason\n</think>\n<answer>\nanswer\n</answer><|im_end|>",  # special token left in the text
]


def random_completions(count, seed=0):
    """Random strings built from tags, newlines, spaces, ASCII and Chinese words, and near-misses of the format."""
    rng = random.Random(seed)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "\n", "\n\n", " ", "x", "step", "答案", "北京", "<", ">", "/"]
    template = ["<think>", "\n", "thought", "\n", "</think>", "\n", "<answer>", "\n", "answer", "\n", "</answer>"]
    completions = []
    for _ in range(count):
        kind = rng.random()
        if kind < 0.5:
            completions.append("".join(rng.choice(pieces) for _ in range(rng.randint(0, 14))))
        else:  # mutate the well-formed template: drop, duplicate, swap or insert pieces, maybe add a suffix
            parts = list(template)
            for _ in range(rng.randint(0, 3)):
                op = rng.randrange(4)
                index = rng.randrange(len(parts)) if parts else 0
                if op == 0 and parts:
                    parts.pop(index)
                elif op == 1 and parts:
                    parts.insert(index, parts[index])
                elif op == 2 and len(parts) > 1:
                    other = rng.randrange(len(parts))
                    parts[index], parts[other] = parts[other], parts[index]
                else:
                    parts.insert(index, rng.choice(pieces))
            suffix = rng.choice(["", "", "\n", "\n\n", " ", "x"])
            completions.append("".join(parts) + suffix)
    return completions


# --------------------------------------------------------------------------------------------------------------
# Rule rewards.


def test_rule_rewards_follow_the_spec_on_anchor_cases():
    """A few cases worked out by hand from the spec (not from the code)."""
    well_formed, blank_line, trailing_newline, two_newlines = HAND_WRITTEN[:4]
    assert format_reward([], [well_formed, blank_line, trailing_newline, two_newlines]) == [0.5, 0.5, 0.5, 0.0]
    assert tag_count_reward([], [well_formed, "", "<think>\na\n</think>\n<think>\n"]) == [1.0, 0.0, 0.25]
    # a duplicated think block still matches the lazy pattern, but its tags no longer count
    duplicated = HAND_WRITTEN[7]
    assert format_reward([], [duplicated]) == [0.5]
    assert tag_count_reward([], [duplicated]) == [0.5]


@pytest.mark.parametrize("completion", HAND_WRITTEN, ids=[repr(c)[:40] for c in HAND_WRITTEN])
def test_rule_rewards_equal_the_seed_on_hand_written_completions(completion):
    expected_format, expected_tags = seed_rule_rewards([completion])
    assert format_reward(["p"], [completion]) == expected_format
    assert tag_count_reward(["p"], [completion]) == expected_tags


def test_rule_rewards_equal_the_seed_on_random_completions():
    completions = random_completions(3000)
    expected_format, expected_tags = seed_rule_rewards(completions)
    prompts = ["p"] * len(completions)
    assert format_reward(prompts, completions) == expected_format
    tags = tag_count_reward(prompts, completions)
    assert tags == expected_tags and all(type(value) is float for value in tags)
    # the random set really exercises both outcomes of every term
    assert 0.0 in expected_format and 0.5 in expected_format
    assert set(expected_tags) >= {0.0, 0.25, 0.5, 0.75, 1.0}


def test_rule_rewards_accept_conversational_completions():
    completions = HAND_WRITTEN + random_completions(200, seed=1)
    conversational = [[{"role": "assistant", "content": text}] for text in completions]
    prompts = [[{"role": "user", "content": "q"}]] * len(completions)
    assert format_reward(prompts, conversational) == format_reward(prompts, completions)
    assert tag_count_reward(prompts, conversational) == tag_count_reward(prompts, completions)
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": "<think>\na\n"}, {"type": "text", "text": "</think>"}]}]
    assert completion_text(blocks) == "<think>\na\n</think>"
    with pytest.raises(TypeError, match="completion"):
        completion_text([{"role": "assistant", "content": 3}])


def test_completion_text_of_tool_calls_and_multi_turn_completions():
    call = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    assert completion_text([call]) == ""  # only tool calls: scored as empty text, not a TypeError
    assert format_reward(["p"], [[call]]) == [0.0] and tag_count_reward(["p"], [[call]]) == [0.0]
    final = {"role": "assistant", "content": HAND_WRITTEN[0]}
    turns = [call, {"role": "tool", "name": "f", "content": "<answer>\nfrom the tool\n</answer>"}, final]
    assert completion_text(turns) == HAND_WRITTEN[0]  # the last assistant message: the final answer
    assert format_reward(["p"], [turns]) == format_reward(["p"], [HAND_WRITTEN[0]])
    assert completion_text(turns[:2]) == ""  # truncated after the tool result: the tool's text is not scored
    with pytest.raises(TypeError, match="assistant message"):
        completion_text([{"role": "tool", "content": "x"}])


def test_rule_rewards_ignore_trl_keyword_arguments_and_have_clear_names():
    kwargs = {"completion_ids": [[1, 2]], "answer": ["x"], "trainer_state": object(), "log_extra": print, "log_metric": print}
    assert format_reward(prompts=["p"], completions=[HAND_WRITTEN[0]], **kwargs) == [0.5]
    assert tag_count_reward(prompts=["p"], completions=[HAND_WRITTEN[0]], **kwargs) == [1.0]
    assert get_callable_name(format_reward) == "format_reward"
    assert get_callable_name(tag_count_reward) == "tag_count_reward"


# --------------------------------------------------------------------------------------------------------------
# Reward-model term, with a scripted scorer.


class ScriptedScorer:
    """Scores a conversation by a fixed table of the final message's content (values beyond +-3 on purpose)."""

    def __init__(self, table, default=0.0):
        self.table = table
        self.default = default
        self.calls = []

    def score(self, conversations):
        self.calls.append([list(conversation) for conversation in conversations])
        return [self.table.get(conversation[-1]["content"], self.default) for conversation in conversations]

    def get_score(self, conversation):  # upstream's one-at-a-time API, for the oracle
        return self.table.get(conversation[-1]["content"], self.default)


RM_COMPLETIONS = [
    "<think>\nshort\n</think>\n<answer>\nParis\n</answer>",  # full 5.0 -> 3, answer 1.5: 0.4*3 + 0.6*1.5
    "<think>\nlong\n</think>\n<answer>\n  Paris  \n</answer>",  # answer is stripped before scoring -> 1.5
    "no tags at all",  # full only: -7 -> -3
    "<answer>bad</answer> trailing",  # answer "bad" -4 -> -3
    "<answer>\n</answer>",  # empty answer ""
    "plain 2.5",  # within the clip range
    "<answer>one</answer><answer>two</answer>",  # the first answer block counts
    "<think>\n多\n</think>\n<answer>\n北京\n</answer>",  # Chinese
]
RM_TABLE = {
    RM_COMPLETIONS[0]: 5.0,
    "Paris": 1.5,
    RM_COMPLETIONS[1]: -0.5,
    RM_COMPLETIONS[2]: -7.0,
    RM_COMPLETIONS[3]: 0.25,
    "bad": -4.0,
    RM_COMPLETIONS[4]: 2.9,
    "": -1.0,
    RM_COMPLETIONS[5]: 2.5,
    RM_COMPLETIONS[6]: 3.5,
    "one": -3.5,
    "two": 100.0,
    RM_COMPLETIONS[7]: 0.75,
    "北京": 2.0,
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def rendered_prompts(tokenizer, prompts):
    return [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]


CONVERSATIONAL_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "user", "content": "  multi\nline  "},
        {"role": "assistant", "content": "earlier reply"},
        {"role": "user", "content": "请回答这个问题。"},
    ],
]


@pytest.mark.parametrize("reasoning", [True, False])
def test_reward_model_term_equals_the_seed_with_one_scorer_call(tokenizer, reasoning):
    num_generations = len(RM_COMPLETIONS)
    prompts = rendered_prompts(tokenizer, CONVERSATIONAL_PROMPTS)
    completions = RM_COMPLETIONS * len(prompts)
    scorer = ScriptedScorer(RM_TABLE)
    expected = seed_reward_model_scores(prompts, completions, scorer.get_score, num_generations, reasoning)

    reward = RewardModelReward(scorer, reasoning=reasoning)
    trl_prompts = [p for p in prompts for _ in range(num_generations)]  # TRL repeats each prompt per completion
    assert reward(trl_prompts, completions) == expected
    assert len(scorer.calls) == 1
    answers = sum(bool(re.search(r"<answer>(.*?)</answer>", c, re.DOTALL)) for c in completions)
    assert len(scorer.calls[0]) == len(completions) + (answers if reasoning else 0)
    # the default system turn of MiniMind's template reaches the reward model
    assert scorer.calls[0][0][0] == {"role": "system", "content": "You are a helpful assistant"}


def test_reward_model_blend_and_clipping_by_hand(tokenizer):
    prompt = rendered_prompts(tokenizer, CONVERSATIONAL_PROMPTS[:1])[0]
    scorer = ScriptedScorer(RM_TABLE)
    rewards = RewardModelReward(scorer)([prompt] * 4, RM_COMPLETIONS[:4])
    assert rewards == pytest.approx([0.4 * 3.0 + 0.6 * 1.5, 0.4 * -0.5 + 0.6 * 1.5, -3.0, 0.4 * 0.25 + 0.6 * -3.0])
    narrow = RewardModelReward(ScriptedScorer(RM_TABLE), clip=1.0, answer_weight=0.25)([prompt], RM_COMPLETIONS[:1])
    assert narrow == pytest.approx([0.75 * 1.0 + 0.25 * 1.0])


def test_conversational_prompts_are_rendered_with_the_policy_template(tokenizer):
    num_generations = 3
    completions = RM_COMPLETIONS[: num_generations * 2]
    conversational = [p for p in CONVERSATIONAL_PROMPTS for _ in range(num_generations)]
    text = [p for p in rendered_prompts(tokenizer, CONVERSATIONAL_PROMPTS) for _ in range(num_generations)]

    from_text = RewardModelReward(ScriptedScorer(RM_TABLE))(text, completions)
    scorer = ScriptedScorer(RM_TABLE)
    conversational_completions = [[{"role": "assistant", "content": c}] for c in completions]
    from_messages = RewardModelReward(scorer, tokenizer=tokenizer)(conversational, conversational_completions)
    assert from_messages == from_text
    history = scorer.calls[0][3][:-1]  # second prompt: system + user/assistant/user, contents stripped
    assert history == [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "multi\nline"},
        {"role": "assistant", "content": "earlier reply"},
        {"role": "user", "content": "请回答这个问题。"},
    ]

    with pytest.raises(ValueError, match="tokenizer"):
        RewardModelReward(ScriptedScorer(RM_TABLE))(conversational, completions)


def test_reward_model_reward_under_trl_calling_convention(tokenizer):
    """TRL calls `f(prompts=..., completions=..., completion_ids=..., **dataset_columns, trainer_state, log_extra,
    log_metric)` and needs one float per completion."""
    metrics = {}
    scorer = ScriptedScorer(RM_TABLE)
    reward = RewardModelReward(scorer, tokenizer=tokenizer)
    prompts = [CONVERSATIONAL_PROMPTS[0]] * 2
    completions = [[{"role": "assistant", "content": c}] for c in RM_COMPLETIONS[:2]]
    out = reward(
        prompts=prompts,
        completions=completions,
        completion_ids=[[5, 6], [7]],
        answer=["Paris", "Paris"],
        trainer_state=None,
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: metrics.__setitem__(name, value),
    )
    assert len(out) == 2 and all(isinstance(value, float) for value in out)
    assert metrics == {"reward_model/clipped_fraction": 0.25, "reward_model/answer_fraction": 1.0}
    assert get_callable_name(reward) == "reward_model"
    assert get_callable_name(RewardModelReward(scorer, name="internlm2")) == "internlm2"


def test_reward_model_reward_checks_its_inputs():
    class WrongCount:
        def score(self, conversations):
            return [0.0]

    with pytest.raises(ValueError, match="returned 1 scores for 2"):
        RewardModelReward(WrongCount())(["a", "b"], ["x", "y"])
    with pytest.raises(TypeError, match="score"):
        RewardModelReward(object())
    with pytest.raises(ValueError, match="2 prompts but 1"):
        RewardModelReward(ScriptedScorer({}))(["a", "b"], ["x"])


def test_parse_prompt_turns_matches_the_seed_regex():
    rendered = "<|im_start|>system\n sys <|im_end|>\n<|im_start|>user\n\nq1<|im_end|>\n<|im_start|>tool\nx<|im_end|>\n<|im_start|>assistant\n"
    assert parse_prompt_turns(rendered) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}]


def test_minimind_reward_funcs_builds_the_seed_terms():
    scorer = ScriptedScorer({})
    reasoning = minimind_reward_funcs(scorer)
    assert [get_callable_name(f) for f in reasoning] == ["format_reward", "tag_count_reward", "reward_model"]
    chat = minimind_reward_funcs(scorer, reasoning=False)
    assert [get_callable_name(f) for f in chat] == ["reward_model"] and chat[0].reasoning is False
    assert minimind_reward_funcs() == [format_reward, tag_count_reward]
    with pytest.raises(ValueError):
        minimind_reward_funcs(reasoning=False)


def test_reward_funcs_inside_trls_grpo_trainer(tmp_path, tokenizer):
    """One training step of stock TRL with the three seed terms: TRL's conversational prompts reach the reward
    model with MiniMind's system turn, the scorer runs once per generation batch and each term is logged."""
    from trl import GRPOConfig, GRPOTrainer

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.data import load_rlaif_dataset
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from minimind_trl.rewards import InternLM2Scorer

    rows = [{"conversations": [{"content": "中国的首都是哪里？"}, {"content": "北京"}]}, {"conversations": [{"content": "2+3?"}, {"content": "5"}]}]
    (tmp_path / "rlaif.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    inner = InternLM2Scorer.from_pretrained(write_tiny_internlm2_reward_model(tmp_path / "rm", num_hidden_layers=1))

    class Spy:
        calls = []

        def score(self, conversations):
            self.calls.append(conversations)
            return inner.score(conversations)

    config = MiniMindConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tokenizer))
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=6, report_to=[], logging_steps=1, use_cpu=True, save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=MiniMindForCausalLM(config), reward_funcs=minimind_reward_funcs(Spy(), tokenizer=tokenizer), args=args,
        train_dataset=load_rlaif_dataset(tmp_path / "rlaif.jsonl"), processing_class=tokenizer,
    )
    trainer.train()
    assert len(Spy.calls) == 1 and len(Spy.calls[0]) >= 4
    assert all(c[0] == {"role": "system", "content": "You are a helpful assistant"} and c[1]["role"] == "user" for c in Spy.calls[0])
    logged = trainer.state.log_history[0]
    assert {"rewards/format_reward/mean", "rewards/tag_count_reward/mean", "rewards/reward_model/mean"} <= set(logged)
