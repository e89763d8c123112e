"""Upstream's agent reward (d65ef2c `train_agent.py` `calculate_rewards`) as one TRL reward function.

A transcript is the text of each generated turn (`turn_outputs`), whether the third turn still called a tool
(`unfinished`), the sample's tool schemas and `gt`. With `answers[t]` = turn t after its first `</think>`, stripped
(the whole turn stripped without one), the reward adds these terms, logged one by one:

* `tag_balance`         -0.5 x sum over the answers of |count(`<tool_call>`) - count(`</tool_call>`)|;
* without a call in any answer (calls inside a thought do not count):
  * `length`            +0.5 if the last turn has 5..800 characters (stripped), else -0.5;
  * `thinking_length`   if the last turn has `</think>`: +1.0 if the thought before the first one has 20..300
                        characters (stripped), else -0.5;
  * `think_close_count` if it has `</think>`: +0.25 if exactly once, else -0.25;
  * `reward_model`      the reward model's score of the answer after the folded conversation, clipped to [-3, 3];
                        the conversation is the prompt rendered with the sample's tools, so its system turn holds
                        the `# Tools` block (upstream renders it so); 0 without a reward model (`agent_rule_reward`);
  * `repetition_penalty` minus the answer's trigram repetition penalty;
* with calls:
  * `call_gap`          gap = |valid - len(gt)| + (calls - valid): +0.5 if 0, else -0.5 x gap; a valid call is a
                        JSON object naming one of the sample's tools with arguments the tool's check accepts;
  * `gt_match`          +2.5 x (distinct gt items stated in the final text) / len(gt), when gt is not empty; the final
                        text is "" if unfinished, else the last answer after its last `</tool_call>`;
  * `unfinished`        -0.5 if the third turn still called a tool;
  * `repetition_penalty` minus the penalty of the final text (of the last answer when the final text is empty);
* `clip`                what clipping the total to [-3, 3] takes off (0 inside the range).

Upstream's `calculate_rewards` raised `AttributeError` on a call that is not a JSON object (`<tool_call>42`) or whose
`arguments` are a list, and so stopped its training step. Here such a call counts as a call that is not valid: it
widens the gap by one (-0.5) like any malformed call. A missing `gt` (upstream raised on `len(None)`) counts as `[]`.

The terms are not separate reward functions because upstream clips their sum: TRL sums its reward functions after
calling them, so no per-term function could apply the clip. `AgentReward` returns the clipped total and logs each
term's batch mean through TRL's `log_metric` (`<name>/<term>`); the means add up to the logged reward's mean.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..rewards.minimind3_rewards import reward_model_messages, trigram_repetition_penalty
from ..rewards.reward_model import Scorer, check_scorer, clip_score, rendered_prompt_turns
from ..rewards import registry
from ..rewards.registry import RewardEntry, check_reward_model, register_reward
from ..rewards.rule_rewards import Conversation, completion_text
from .data import decode_batch_column, prompt_messages, tool_names
from .parsing import THINK_CLOSE, TOOL_CALL_CLOSE, answer_tool_calls, split_turn, tag_imbalance
from .tools import Toolbox, recipe_toolbox

TERMS = (
    "tag_balance",
    "length",
    "thinking_length",
    "think_close_count",
    "reward_model",
    "call_gap",
    "gt_match",
    "unfinished",
    "repetition_penalty",
    "clip",
)
NUMBER_IN_TEXT = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w.])")
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
TOTAL_CLIP = 3.0


def _set_key(item: Any) -> Any:
    """`item` itself where a set can hold it (so 1, 1.0 and True are one item, as in upstream's set)."""
    try:
        hash(item)
    except TypeError:
        return ("unhashable", repr(item))
    return item


def verified_gt(text: str, gt: Sequence) -> list:
    """The distinct gt items `text` states (upstream's `validate_gt_in_text`, a set there): an item is stated if its
    stripped `str()` occurs in the text (case-insensitive), or if it is a number (commas ignored) within 1e-6 of a
    number of the comma-free text that is not part of a word or a longer number."""
    text = str(text)
    lowered = text.lower()
    numbers = [float(found) for found in NUMBER_IN_TEXT.findall(text.replace(",", ""))]
    stated: dict[Any, Any] = {}
    for item in gt:
        item_text = str(item).strip()
        plain = item_text.replace(",", "")
        if (item_text and item_text.lower() in lowered) or (
            NUMBER.fullmatch(plain) and any(abs(float(plain) - number) < 1e-6 for number in numbers)
        ):
            stated.setdefault(_set_key(item), item)
    return list(stated.values())


def _answer_terms(response: str, answer: str) -> tuple[dict[str, float], str]:
    """The no-call terms but the reward model's, and the answer the reward model scores."""
    terms = {"length": 0.5 if 5 <= len(response.strip()) <= 800 else -0.5}
    if THINK_CLOSE in response:
        thought, rest = response.split(THINK_CLOSE, 1)
        terms["thinking_length"] = 1.0 if 20 <= len(thought.strip()) <= 300 else -0.5
        terms["think_close_count"] = 0.25 if response.count(THINK_CLOSE) == 1 else -0.25
        answer = rest.strip()
    terms["repetition_penalty"] = -trigram_repetition_penalty(answer)
    return terms, answer


def _call_terms(calls: list, answer: str, tools, gt: list, unfinished: bool, toolbox: Toolbox) -> dict[str, float]:
    offered = tool_names(tools)
    valid = sum(toolbox.is_valid_call(call, offered) for call in calls)
    gap = abs(valid - len(gt)) + max(0, len(calls) - valid)
    final = "" if unfinished else answer.rpartition(TOOL_CALL_CLOSE)[2]
    terms = {"call_gap": 0.5 if gap == 0 else -0.5 * gap}
    if gt:
        terms["gt_match"] = 2.5 * len(verified_gt(final, gt)) / len(gt)
    if unfinished:
        terms["unfinished"] = -0.5
    terms["repetition_penalty"] = -trigram_repetition_penalty(final or answer)
    return terms


def transcript_terms(
    turn_outputs: Sequence[str],
    *,
    tools: list[dict] | None,
    gt: list,
    unfinished: bool,
    toolbox: Toolbox,
    response: str | None = None,
) -> tuple[dict[str, float], str | None]:
    """Every term but `reward_model` and `clip` of one transcript, and the answer the reward model must score
    (None on the call branch, which it does not score). `response` is the last turn (default `turn_outputs[-1]`)."""
    response = turn_outputs[-1] if response is None else response
    answers = [split_turn(text)[1] for text in turn_outputs]
    answer = answers[-1] if answers else response.strip()
    terms = {"tag_balance": -0.5 * tag_imbalance(turn_outputs)}
    calls = answer_tool_calls(turn_outputs)
    if not calls:
        answer_terms, scored_answer = _answer_terms(response, answer)
        return {**terms, **answer_terms}, scored_answer
    return {**terms, **_call_terms(calls, answer, tools, gt, unfinished, toolbox)}, None


def clipped_total(terms: Mapping[str, float], clip: float = TOTAL_CLIP) -> float:
    """The sum of the terms clipped to [-clip, clip]; records what the clip took off as `terms["clip"]`."""
    raw = sum(value for key, value in terms.items() if key != "clip")
    total = max(min(raw, clip), -clip)
    terms["clip"] = total - raw
    return total


class AgentReward:
    """Upstream's agent reward as a TRL reward function (see the module docstring).

    TRL calls it with the prompts, the completions and, as keywords, the dataset's `tools` and `gt` columns and the
    rollout's extra fields `turn_outputs` (one list of turn texts per completion, decoded with
    `skip_special_tokens=True`) and `unfinished`. Without `turn_outputs` each completion counts as one turn that
    finished (upstream's fallback).

    Args:
        scorer: the reward model (a `Scorer`, called once per call of this function with every answer of the
            no-call branch), or None for no reward-model term (upstream with `reward_model=None`).
        tokenizer: the policy's tokenizer, to render conversational prompts with the sample's tools.
        toolbox: whose argument checks make a call valid (default: upstream's six mocks and `CHECK_ARGS`).
        reward_model_clip: the reward model's score is clipped to [-clip, clip] (upstream: 3).
        clip: the total is clipped to [-clip, clip] (upstream: 3).
        chat_template_kwargs: the trainer's; they only change the generation prompt, which the parse drops.
        name: the `__name__` TRL logs this function under (`rewards/<name>/mean`); terms go to `<name>/<term>`.
    """

    def __init__(
        self,
        scorer: Scorer | None = None,
        *,
        tokenizer: Any = None,
        toolbox: Toolbox | None = None,
        reward_model_clip: float = 3.0,
        clip: float = TOTAL_CLIP,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ):
        if scorer is not None:
            check_scorer(scorer)
        if not (reward_model_clip > 0 and clip > 0):
            raise ValueError(f"clips must be positive, got reward_model_clip={reward_model_clip}, clip={clip}")
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.toolbox = toolbox or Toolbox()
        self.reward_model_clip = reward_model_clip
        self.clip = clip
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.__name__ = name or ("agent_reward" if scorer is not None else "agent_rule_reward")

    def prompt_turns(self, prompt: str | Conversation, tools: list[dict] | None) -> Conversation:
        """The closed turns of the prompt rendered with the sample's tools (text prompts parsed as they are)."""
        if not isinstance(prompt, str):
            prompt = prompt_messages(prompt)
        return rendered_prompt_turns(prompt, self.tokenizer, self.chat_template_kwargs, self.__name__, tools=tools)

    def _reward_model_scores(self, prompts: list, tools: list, answers: list[str | None]) -> list[float]:
        """The clipped score of each answer to score (0.0 for the call branch's None), in one scorer call."""
        rows = [row for row, answer in enumerate(answers) if answer is not None]
        if self.scorer is None or not rows:
            return [0.0] * len(answers)
        conversations = [reward_model_messages(self.prompt_turns(prompts[r], tools[r]), answers[r]) for r in rows]
        raw = [float(score) for score in self.scorer.score(conversations)]
        if len(raw) != len(rows):
            raise ValueError(f"the scorer returned {len(raw)} scores for {len(rows)} conversations")
        scores = [0.0] * len(answers)
        for row, score in zip(rows, raw):
            scores[row] = clip_score(score, self.reward_model_clip)
        return scores

    def terms(self, prompts: list, completions: list, **kwargs) -> list[dict[str, float]]:
        """Every term of every completion (`clip` included), the reward model asked once."""
        count = len(completions)
        if len(prompts) != count:
            raise ValueError(f"got {len(prompts)} prompts but {count} completions")
        turn_outputs = kwargs.get("turn_outputs") or [None] * count
        unfinished = kwargs.get("unfinished") or [False] * count
        tools = decode_batch_column(kwargs.get("tools") or [None] * count, "tools")
        gt = decode_batch_column(kwargs.get("gt") or [None] * count, "gt")
        for key, values in (("turn_outputs", turn_outputs), ("unfinished", unfinished), ("tools", tools), ("gt", gt)):
            if len(values) != count:
                raise ValueError(f"got {len(values)} {key} values for {count} completions")
        per_completion, answers = [], []
        for row, completion in enumerate(completions):
            turns = list(turn_outputs[row]) if turn_outputs[row] is not None else [completion_text(completion)]
            response = turns[-1] if turns else completion_text(completion)
            terms, answer = transcript_terms(
                turns, tools=tools[row], gt=gt[row], unfinished=bool(unfinished[row]), toolbox=self.toolbox,
                response=response,
            )  # fmt: skip
            per_completion.append(terms)
            answers.append(answer)
        for terms, answer, score in zip(per_completion, answers, self._reward_model_scores(prompts, tools, answers)):
            if answer is not None:
                terms["reward_model"] = score
        return per_completion

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        per_completion = self.terms(prompts, completions, **kwargs)
        rewards = [clipped_total(terms, self.clip) for terms in per_completion]
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and per_completion:
            for term in TERMS:
                log_metric(f"{self.__name__}/{term}", sum(t.get(term, 0.0) for t in per_completion) / len(rewards))
            called = sum("call_gap" in terms for terms in per_completion)
            log_metric(f"{self.__name__}/tool_call_fraction", called / len(rewards))
        return rewards

    def __repr__(self) -> str:
        scorer = type(self.scorer).__name__ if self.scorer is not None else None
        return f"AgentReward(scorer={scorer}, toolbox={self.toolbox!r}, clip={self.clip})"


def build_agent_reward(script_args, context, tokenizer, scorer: Scorer | None) -> AgentReward:
    """The registry's builder: `agent_reward` with the reward model's scorer, `agent_rule_reward` with None."""
    return AgentReward(
        scorer,
        tokenizer=tokenizer,
        toolbox=recipe_toolbox(script_args),
        reward_model_clip=getattr(script_args, "reward_model_clip", 3.0),
        chat_template_kwargs=context.chat_template_kwargs,
    )


def check_agent_tools(script_args, training_args) -> None:
    """The agent reward's tools (`agent_tools`): every name a mock or an importable function."""
    recipe_toolbox(script_args)


def check_agent_reward(script_args, training_args) -> None:
    check_reward_model(script_args, training_args)
    check_agent_tools(script_args, training_args)


def build_agent_model_reward(script_args, context, tokenizer) -> AgentReward:
    """`agent_reward`: the reward model's score on the no-call branch."""
    kind = check_reward_model(script_args, context)
    scorer = registry.load_scorer(script_args.reward_model_name_or_path, kind, context.device)
    return build_agent_reward(script_args, context, tokenizer, scorer)


def build_agent_rule_reward(script_args, context, tokenizer) -> AgentReward:
    """`agent_rule_reward`: no reward model (upstream's `reward_model=None`)."""
    return build_agent_reward(script_args, context, tokenizer, None)


# The agent's rewards in the table recipes pick from (`reward_funcs: [agent_reward]`), registered here, where they live.
register_reward("agent_reward", RewardEntry(
    "upstream's agent reward: tool-call gap, gt in the final answer, unfinished penalty, or (no call) format terms "
    "and the reward model with the # Tools prompt; clipped to [-3, 3], each term logged",
    build=build_agent_model_reward, check=check_agent_reward, python="AgentReward", module="minimind_trl.agent",
    scores_with_reward_model=True, rule_only="agent_rule_reward",
))  # fmt: skip
register_reward("agent_rule_reward", RewardEntry(
    "agent_reward without the reward-model term",
    build=build_agent_rule_reward, check=check_agent_tools, python="AgentReward", module="minimind_trl.agent",
))  # fmt: skip


__all__ = [
    "TERMS",
    "AgentReward",
    "build_agent_reward",
    "clipped_total",
    "transcript_terms",
    "verified_gt",
]
