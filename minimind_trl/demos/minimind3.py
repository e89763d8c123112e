"""What `minimind-trl demo --upstream minimind3` changes: MiniMind-3's completion layout, its warm-start examples,
how its reward-model term asks the demo's reward model, and where the answer the content check reads is.

MiniMind-3 (upstream d65ef2c) has no `<answer>` block. Its chat template ends the prompt with an open thought
(`<think>\\n`, `open_thinking=True`, chosen per prompt with `thinking_ratio`) or a closed empty one; the completion
is then `thinking\\n</think>\\n\\nanswer` (open) or the answer alone (closed). Its reward-model term scores the
answer (the text after the first `</think>`) after one user turn that folds the prompt's turns
(`minimind_trl.rewards.minimind3_rewards.reward_model_messages`): with an added system prompt the question is
preceded by `system: ...` and upstream's Chinese separator, which the seed demo's reward model never saw. So this
variant trains the demo's reward model on pairs asked exactly that way (`PAIRS`), with the same preference: the
answer is in the question's language.
"""

import random
import re

from ..prompt_rendering import SYSTEM_PROMPTS, keyed_uniform
from ..rewards.minimind3_rewards import reward_model_messages, split_thinking
from .reward_model import CJK, TAGS, Fragments, PairLayout, answer_pair, language_matches, mixed_answer

THINK_CLOSE = "</think>"
OTHER = {"zh": "en", "en": "zh"}
EXAMPLE = re.compile(r"^<think>\n(.*?)\n</think>\n<answer>\n(.*?)\n</answer>$", re.DOTALL)
# Share of the reward model's training pairs whose prompt carries one of upstream's system prompts: above GRPO's
# 20 % (system_prompt_ratio) so that the folded form (`system: ...`, upstream's separator, the question) is learnt
# too.
PAIRS_SYSTEM_RATIO = 0.5
# Share of an English question's pairs whose rejected answer is English with Chinese mixed in: without them the
# policy (seed 42) learns to answer every question "苹果是apple", which a reward model trained without such pairs
# scores high for English questions too (MiniMind-3's term, seeing only the short answer, is easy to game; the seed
# demo's pairs mix as often, `reward_model.MIXED_RATIO`, against its policy's "水是water。").
PAIRS_MIXED_RATIO = 0.3
# Share of the pairs whose two answers are as long as a whole completion (6-24 pieces, a few words repeated, as a
# collapsed tiny policy writes them): once the policy stops closing its thought, MiniMind-3's term scores all of
# its completion, far longer than the pairs' 1-4 pieces, and a reward model trained without them scored such
# filler ("TheThe capitalThe of of of ...") above the clip for Chinese questions too: on seed 4 every answer became
# English filler (answers in the question's language 43 % -> 59 %). Half of an English question's long pairs reject
# the same English filler with a Chinese piece or two in it: without them, seed 1 (on AVX2 kernels) answered English
# questions with filler in which the warm start's Chinese thought words lingered ("16得 + opposite of of is"), scored
# +3.7 for English questions (answers in the question's language +0.29).
PAIRS_LONG_RATIO = 0.3
# Share of the pairs whose two answers are padded with runs of newlines and stray tags, and share whose rejected
# answer is nothing but such a run: a policy that pads its completions (MiniMind-3's `length` term pays from 20
# characters, and the demo's 32-token completions never reach upstream's 800-character limit) puts newlines and
# `</think>` after its first `</think>`, and a reward model trained without them scored a bare `</think>` above
# the clip for English questions ("think" reads as English): seeds 6 and 42 learned to answer English questions
# that way (answers in the question's language +0.14 and +0.28).
PAIRS_PADDED_RATIO = 0.4
PAIRS_TAGS_ONLY_RATIO = 0.2
PADDING = ("\n", "\n\n", "</think>", "</think>\n", "<think>")


def answer_text(completion: str) -> str:
    """MiniMind-3's answer (the text after the first `</think>`, stripped; the whole completion without one), with
    stray tags removed: what the content check reads."""
    return TAGS.sub(" ", split_thinking(completion)[1]).strip()


def in_question_language(question: str, completion: str) -> bool:
    """The demo's content property on MiniMind-3's answer."""
    return language_matches(question, answer_text(completion))


def has_layout(completion: str) -> bool:
    """MiniMind-3's layout after an open thought: exactly one `</think>`, then a non-empty answer."""
    thinking, answer = split_thinking(completion)
    return thinking is not None and completion.count(THINK_CLOSE) == 1 and bool(answer)


# --------------------------------------------------------------------------- the demo's sixth reward term

# The demo's completions stop at 32 tokens (recipes/demo/grpo_minimind3.yaml's max_completion_length), so a policy
# that never ends one reaches neither MiniMind-3's 1024-token cap nor its `length` term's 800-character limit:
# upstream punishes a runaway completion, the demo's five terms pay it. On some seeds (6 on AVX2 kernels, 8
# natively) the policy ran nearly every completion to the cap around step 100 and never learned the answers'
# language. DAPO's soft overlong punishment (TRL's `get_soft_overlong_punishment`) restores the limit at the demo's
# scale: 0 up to 24 tokens, then down to -1 at the cap.
MAX_COMPLETION_LENGTH = 32
OVERLONG_CACHE = 8


def overlong_punishment(prompts=None, completions=None, completion_ids=None, **kwargs) -> list[float]:
    """TRL's soft overlong punishment at the demo's completion length, as a reward function recipes can name
    (`minimind_trl.demos.minimind3:overlong_punishment`)."""
    from trl.rewards import get_soft_overlong_punishment

    if completion_ids is None:
        raise ValueError("overlong_punishment scores each completion's token ids: pass completion_ids (TRL does)")
    return get_soft_overlong_punishment(MAX_COMPLETION_LENGTH, OVERLONG_CACHE)(completion_ids)


# --------------------------------------------------------------------------- warm start


def warm_start_rows(conversations: list[list[dict]], thinking_ratio: float, seed: int) -> list[dict]:
    """The bundled format examples (`<think>\\nT\\n</think>\\n<answer>\\nA\\n</answer>`) as TRL SFT prompt-completion
    rows in MiniMind-3's layout: each row's prompt opens the thought with probability `thinking_ratio` (keyed on
    `seed` and the row, as GRPO's prompts; TRL passes the row's `chat_template_kwargs` to the template) and its
    completion is `T\\n</think>\\n\\nA`, or `A` alone after a closed thought. The chat template renders the assistant
    turn with its thought, so the prompt is a prefix of prompt + completion either way."""
    rows = []
    for row, turns in enumerate(conversations):
        match = EXAMPLE.match(turns[-1]["content"])
        if match is None:
            raise ValueError(f"format example {row} is not <think>/<answer> laid out: {turns[-1]['content']!r}")
        thought, answer = match.groups()
        open_thinking = keyed_uniform(seed, 0, row, "open_thinking") < thinking_ratio
        reply = f"{thought}\n{THINK_CLOSE}\n\n{answer}" if open_thinking else answer
        rows.append({
            "prompt": turns[:-1],
            "completion": [{"role": "assistant", "content": reply}],
            "chat_template_kwargs": {"open_thinking": open_thinking},
        })
    return rows


# --------------------------------------------------------------------------- the reward model's pairs


def conversation(question: str, answer: str, system_prompt: str | None) -> list[dict]:
    """What MiniMind-3's reward-model term asks about: the folded prompt turns (a system prompt, if any, then the
    question) and the answer, stripped as upstream strips it."""
    turns = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
        {"role": "user", "content": question}
    ]
    return reward_model_messages(turns, answer.strip())


def tags_only(rng: random.Random, most: int) -> str:
    """One to `most` pieces of padding: newlines and reasoning tags, no language."""
    return "".join(rng.choice(PADDING) for _ in range(rng.randint(1, most)))


def padded(rng: random.Random, text: str) -> str:
    """`text` with one to four runs of padding (`tags_only`) put in at random places."""
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(text))
        text = text[:at] + tags_only(rng, 6) + text[at:]
    return text


def sprinkled(rng: random.Random, text: str, pieces: list[str]) -> str:
    """`text` with one or two of `pieces` put in at random places."""
    for _ in range(rng.randint(1, 2)):
        at = rng.randint(0, len(text))
        text = text[:at] + rng.choice(pieces) + text[at:]
    return text


def make_pairs(questions: list[str], fragments: Fragments, count: int, seed: int) -> list[tuple]:
    """`count` (question, chosen answer, rejected answer, system prompt or None) tuples: the answers of the seed's
    pairs (`answer_pair`), without the think part MiniMind-3's term never shows the reward model, for English
    questions also rejected answers that mix in Chinese (`PAIRS_MIXED_RATIO`), and pairs of answers as long as a
    whole completion (`PAIRS_LONG_RATIO`), among them English filler against the same filler with Chinese in it,
    answers padded with newlines and tags (`PAIRS_PADDED_RATIO`) and rejected answers that are only padding
    (`PAIRS_TAGS_ONLY_RATIO`)."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < count:
        question = rng.choice(questions)
        chosen, rejected = answer_pair(rng, question, fragments)
        if not CJK.search(question) and rng.random() < PAIRS_MIXED_RATIO:
            rejected = mixed_answer(rng, fragments)
        if rng.random() < PAIRS_LONG_RATIO:
            own, words = ("zh" if CJK.search(question) else "en"), rng.randint(6, 24)
            chosen, rejected = fragments.filler(rng, own, words), fragments.filler(rng, OTHER[own], words)
            if own == "en" and rng.random() < 0.5:
                rejected = sprinkled(rng, chosen, fragments.chinese)
        if rng.random() < PAIRS_PADDED_RATIO:
            chosen, rejected = padded(rng, chosen), padded(rng, rejected)
        if rng.random() < PAIRS_TAGS_ONLY_RATIO:
            rejected = tags_only(rng, 12)
        system_prompt = rng.choice(SYSTEM_PROMPTS) if rng.random() < PAIRS_SYSTEM_RATIO else None
        if language_matches(question, TAGS.sub(" ", chosen).strip()) and not language_matches(
            question, TAGS.sub(" ", rejected).strip()
        ):
            pairs.append((question, chosen, rejected, system_prompt))
    return pairs


# Centred as the seed demo's pairs are (`PairLayout`): with only a weak pull towards 0, the reward model's scores
# for English questions sat near or above the +3 clip for good and bad answers alike on some seeds, which left
# GRPO no signal about those answers' language.
PAIRS = PairLayout(make_pairs, conversation)

__all__ = [
    "PAIRS",
    "answer_text",
    "conversation",
    "has_layout",
    "in_question_language",
    "make_pairs",
    "overlong_punishment",
    "warm_start_rows",
]
