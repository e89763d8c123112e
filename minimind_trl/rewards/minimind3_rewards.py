"""MiniMind-3's GRPO rewards (upstream d65ef2c, `calculate_rewards`) as TRL reward functions, one per term.

Upstream adds, per completion: a length term, two terms that apply only when the completion closes a thought
(`</think>`), minus a trigram repetition penalty of the answer, plus the reward model's score of the answer with
the conversation folded into one user turn. Each term is its own function here, named as recipes list it, so TRL
logs `rewards/<name>/mean` for each; with weights 1 their sum is upstream's reward:

* `length`              +0.5 if `20 <= len(response.strip()) <= 800`, else -0.5;
* `thinking_length`     with `</think>`: +1.0 if the text before the first one is 20..300 characters (stripped),
                        else -0.5; without: 0;
* `think_close_count`   with `</think>`: +0.25 if it occurs exactly once, else -0.25; without: 0;
* `repetition_penalty`  minus `trigram_repetition_penalty(answer)`;
* `answer_reward_model` (`AnswerRewardModelReward`) the reward model's score of the answer, clipped to [-3, 3].

The answer is the text after the first `</think>`, stripped; without `</think>` it is the whole completion,
unstripped (upstream's rule). Completions are the text TRL decoded (`skip_special_tokens=True`, as upstream's
rollout engine decodes); MiniMind-3's `<think>`/`</think>` are added tokens that are not special, so they stay.
"""

import re
from collections.abc import Mapping
from typing import Any

from .reward_model import Scorer, check_scorer, clip_score, rendered_prompt_turns
from .rule_rewards import Conversation, completion_text

THINK_CLOSE = "</think>"
WORD_OR_SYMBOL = re.compile(r"\w+|[^\w\s]")
HISTORY_SEPARATOR = "\n以上是对话历史。我的新问题是：\n"  # upstream's words between the history and the new question


def split_thinking(text: str) -> tuple[str | None, str]:
    """`(thinking, answer)`: split at the first `</think>`, the answer stripped; `(None, text)` without one."""
    if THINK_CLOSE not in text:
        return None, text
    thinking, answer = text.split(THINK_CLOSE, 1)
    return thinking, answer.strip()


def trigram_repetition_penalty(text: str, n: int = 3, cap: float = 0.5) -> float:
    """Share of repeated word n-grams, scaled: `min(cap, repeats * cap * 2 / ngrams)`, 0 without any n-gram.

    Words are `\\w+` runs and single non-space symbols of the lower-cased text (so each Chinese character run
    is one word and each punctuation mark another)."""
    words = WORD_OR_SYMBOL.findall(text.lower())
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return min(cap, (len(grams) - len(set(grams))) * cap * 2 / len(grams))


def _texts(completions: list) -> list[str]:
    return [completion_text(completion) for completion in completions]


def length(prompts: list, completions: list, **kwargs) -> list[float]:
    """+0.5 when the stripped completion has 20 to 800 characters, else -0.5."""
    return [0.5 if 20 <= len(text.strip()) <= 800 else -0.5 for text in _texts(completions)]


def thinking_length(prompts: list, completions: list, **kwargs) -> list[float]:
    """With `</think>`: +1.0 when the thought before the first one has 20 to 300 characters (stripped), else
    -0.5. Without `</think>`: 0."""
    rewards = []
    for text in _texts(completions):
        thinking, _ = split_thinking(text)
        if thinking is None:
            rewards.append(0.0)
        else:
            rewards.append(1.0 if 20 <= len(thinking.strip()) <= 300 else -0.5)
    return rewards


def think_close_count(prompts: list, completions: list, **kwargs) -> list[float]:
    """With `</think>`: +0.25 when it occurs exactly once, else -0.25. Without `</think>`: 0."""
    rewards = []
    for text in _texts(completions):
        count = text.count(THINK_CLOSE)
        rewards.append(0.0 if count == 0 else (0.25 if count == 1 else -0.25))
    return rewards


def repetition_penalty(prompts: list, completions: list, **kwargs) -> list[float]:
    """Minus the trigram repetition penalty of the answer (at most 0.5)."""
    return [-trigram_repetition_penalty(split_thinking(text)[1]) for text in _texts(completions)]


def folded_question(turns: Conversation) -> str:
    """Upstream's one user turn for the reward model: every turn but the last as `"{role}: {content}"` lines,
    then `以上是对话历史。我的新问题是：` and the last turn's content; just that content without history."""
    if not turns:
        return ""
    history = "\n".join(f"{turn['role']}: {turn['content']}" for turn in turns[:-1])
    question = turns[-1]["content"]
    return f"{history}{HISTORY_SEPARATOR}{question}" if history else question


def reward_model_messages(prompt_turns: Conversation, answer: str) -> Conversation:
    """The two turns the reward model scores: the folded question and the answer."""
    return [{"role": "user", "content": folded_question(prompt_turns)}, {"role": "assistant", "content": answer}]


class AnswerRewardModelReward:
    """MiniMind-3's reward-model term: the answer, scored after the folded conversation, clipped to [-clip, clip].

    The prompt's turns are parsed from the *rendered* prompt (`parse_prompt_turns`, upstream's ChatML regex), so
    the open generation turn is not among them. Conversational prompts are rendered first with the policy's chat
    template, `add_generation_prompt=True` and `chat_template_kwargs` (pass the trainer's); text prompts (already
    rendered, e.g. by `thinking_ratio`) are parsed as they are. No blend with the whole completion (MiniMind2's
    `0.4/0.6` is `RewardModelReward`).

    Args:
        scorer: a `Scorer`; called once per call of this function, with every completion's two turns in order.
        tokenizer: the policy's tokenizer, needed for conversational prompts only.
        clip: scores are clipped to [-clip, clip] (upstream: 3.0, inside `get_score`).
        chat_template_kwargs: extra arguments of the policy's chat template (the trainer's).
        name: the `__name__` TRL logs this function under (`rewards/<name>/mean`).
    """

    def __init__(
        self,
        scorer: Scorer,
        *,
        tokenizer: Any = None,
        clip: float = 3.0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        name: str = "answer_reward_model",
    ):
        check_scorer(scorer)
        if not clip > 0:
            raise ValueError(f"clip must be positive, got {clip}")
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.clip = clip
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.__name__ = name

    def prompt_turns(self, prompt: str | Conversation) -> Conversation:
        """The closed turns of one prompt as the policy saw it (text as given, messages rendered first)."""
        return rendered_prompt_turns(prompt, self.tokenizer, self.chat_template_kwargs, self.__name__)

    def messages(self, prompts: list, completions: list) -> list[Conversation]:
        """What the reward model is asked about, one conversation per completion."""
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions")
        return [
            reward_model_messages(self.prompt_turns(prompt), split_thinking(text)[1])
            for prompt, text in zip(prompts, _texts(completions))
        ]

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        conversations = self.messages(prompts, completions)
        scores = [float(score) for score in self.scorer.score(conversations)]
        if len(scores) != len(conversations):
            raise ValueError(f"the scorer returned {len(scores)} scores for {len(conversations)} conversations")
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and scores:
            log_metric(f"{self.__name__}/clipped_fraction", sum(abs(s) > self.clip for s in scores) / len(scores))
        return [clip_score(score, self.clip) for score in scores]

    def __repr__(self) -> str:
        return f"AnswerRewardModelReward(scorer={type(self.scorer).__name__}, clip={self.clip})"


MINIMIND3_RULE_REWARDS = (length, thinking_length, think_close_count, repetition_penalty)

__all__ = [
    "HISTORY_SEPARATOR",
    "MINIMIND3_RULE_REWARDS",
    "THINK_CLOSE",
    "AnswerRewardModelReward",
    "folded_question",
    "length",
    "repetition_penalty",
    "reward_model_messages",
    "split_thinking",
    "think_close_count",
    "thinking_length",
    "trigram_repetition_penalty",
]
