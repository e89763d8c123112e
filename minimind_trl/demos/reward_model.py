"""The demo's reward model: a tiny InternLM2-layout reward model that prefers answers in the question's language.

    python -m minimind_trl.demos.reward_model OUTPUT_FOLDER [--seed 0] [--steps 200]

The demo's full reward (`--rewards full`) is upstream's reasoning reward: format + tag_count + a reward model,
clipped to +-3 and blended 0.4 on the whole completion / 0.6 on the `<answer>` text. The reward model here has
InternLM2's published layout and tokenizer files (written by `models.internlm2_reward.tiny`), so the native
loader and `InternLM2Scorer` run for real; it is trained in seconds on preference pairs generated from the
bundled prompts with a Bradley-Terry loss (`-log sigmoid(r_chosen - r_rejected)`, each pair's scores centred on 0
as TRL's `center_rewards_coefficient` does: see `PairLayout`), torch's AdamW.

What it prefers, checkable without it (`in_question_language`): the `<answer>` text (the whole completion when
there is no `<answer>` block; tags removed) is in the question's language: a Chinese question's answer contains a
Chinese character; an English question's answer contains a Latin letter or digit and no Chinese. The bundled SFT
examples break it in 135 of 308 replies (Chinese arithmetic questions answered "11", translations), and the
warm-started policy's samples have it 9-38 % of the time (docs/demo.md#the-full-reward-a-reward-model-trained-offline).
"""

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CJK = re.compile(r"[\u4e00-\u9fff]")
LATIN_OR_DIGIT = re.compile(r"[A-Za-z0-9]")
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
TAGS = re.compile(r"</?(think|answer)>")
CONTENT_METRIC = "answer in the question's language"
# English questions whose rejected answer mixes in Chinese, half of them the bundled lines that do ("水是water。"):
# without them seed 3's policy answered every question "水是water。", and seed 2's "月亮是moon" (with only made-up
# mixes), which the reward model scored above 0 for English questions too.
MIXED_RATIO = 0.3
HELD_OUT_EVERY = 5  # every 5th bundled prompt is held out: from the reward model's pairs and for content checks

# The reward model's size: the published layout at toy size (tiny.py's defaults are 32 wide).
REWARD_MODEL_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                       "torch_dtype": "float32"}


def answer_text(completion: str) -> str:
    """The `<answer>` block's text (as upstream's blend cuts it), without reasoning tags, stripped; the whole
    completion when it has no `<answer>` block. A tag's letters never count as English."""
    match = ANSWER.search(completion)
    return TAGS.sub(" ", match.group(1) if match else completion).strip()


def in_question_language(question: str, completion: str) -> bool:
    """The demo's content property: the answer is written in the question's language (see the module doc)."""
    return language_matches(question, answer_text(completion))


def language_matches(question: str, text: str) -> bool:
    """`text` (an answer, tags removed) is in the question's language: a Chinese character for a Chinese question;
    a Latin letter or digit and no Chinese for an English one."""
    if CJK.search(question):
        return bool(CJK.search(text))
    return bool(LATIN_OR_DIGIT.search(text)) and not CJK.search(text)


def content_share(questions: list[str], completions: list[str], in_language=in_question_language) -> float:
    """Share of completions whose answer is in its question's language (`in_language`: the generation's check)."""
    return sum(in_language(q, c) for q, c in zip(questions, completions)) / max(len(completions), 1)


def split_prompts(prompts: list[str]) -> tuple[list[str], list[str]]:
    """(train, held out): every HELD_OUT_EVERY-th prompt is held out."""
    return (
        [p for i, p in enumerate(prompts) if i % HELD_OUT_EVERY],
        [p for i, p in enumerate(prompts) if i % HELD_OUT_EVERY == 0],
    )


# --------------------------------------------------------------------------- preference pairs


@dataclass
class Fragments:
    """Pieces of text the pairs are made of, by language: words and sentences of the bundled replies, numbers,
    punctuation; completions are salads of them, like a tiny policy's samples. `mixed`: the bundled lines that mix
    both languages ("月亮是moon。"), which the warm start teaches the policy to write."""

    chinese: list[str]
    english: list[str]
    neutral: list[str]
    mixed: tuple[str, ...] = ()

    @classmethod
    def from_texts(cls, texts: list[str]) -> "Fragments":
        chinese, english, mixed = set(), set(), set()
        for text in texts:
            for piece in re.findall(r"[\u4e00-\u9fff]+|[A-Za-z]+", text):
                (chinese if CJK.match(piece) else english).add(piece)
                if CJK.match(piece):
                    chinese.update(piece[i : i + 2] for i in range(0, len(piece), 2))
            for line in TAGS.sub(" ", text).splitlines():
                if CJK.search(line) and re.search("[A-Za-z]", line):
                    mixed.add(line.strip())
        neutral = [str(n) for n in range(100)] + list(".,?!=+-。，？ ")
        return cls(sorted(chinese), sorted(english), neutral, tuple(sorted(mixed)))

    def text(self, rng: random.Random, language: str, words: int) -> str:
        """`words` pieces: one or more of `language` ("zh" / "en"), the rest neutral (numbers, punctuation)."""
        own = self.chinese if language == "zh" else self.english
        pieces = [rng.choice(own)] + [rng.choice(own if rng.random() < 0.5 else self.neutral) for _ in range(words - 1)]
        rng.shuffle(pieces)
        return (" " if language == "en" else "").join(pieces)

    def filler(self, rng: random.Random, language: str, words: int) -> str:
        """`words` pieces drawn from a few words of `language` and the neutral ones: the long, repetitive answer of
        a tiny policy that found one phrase to say ("The capital of of of The ...")."""
        own = self.chinese if language == "zh" else self.english
        few = rng.sample(own, rng.randint(1, 4))
        pieces = [rng.choice(few)] + [rng.choice(few if rng.random() < 0.8 else self.neutral) for _ in range(words - 1)]
        return rng.choice(("", " ") if language == "en" else ("",)).join(pieces)

    def noise(self, rng: random.Random, words: int) -> str:
        """Any language: what the think part or a stray line may hold."""
        pool = (self.chinese, self.english, self.neutral)
        return "".join(rng.choice(rng.choice(pool)) for _ in range(words))


# What a tiny policy puts into an answer besides words: stray tags, newlines, a broken UTF-8 character (its
# byte-level tokens can end mid-character), punctuation. None of it is language; the property ignores it.
JUNK = ("<answer>", "<think>", "</think>", "\n", "\ufffd", "。", ".", " ", '"', "=")


def junk(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(JUNK) for _ in range(rng.randint(0, most)))


def answer_pair(rng: random.Random, question: str, fragments: Fragments) -> tuple[str, str]:
    """(chosen, rejected) answers for `question`: the chosen in the question's language, the rejected in the other
    language, only numbers/punctuation, or junk; both may carry junk around the words."""
    own = "zh" if CJK.search(question) else "en"
    chosen = fragments.text(rng, own, rng.randint(1, 4))
    roll = rng.random()
    if roll < 0.45:
        rejected = fragments.text(rng, "en" if own == "zh" else "zh", rng.randint(1, 4))
    elif roll < 0.6 and own == "zh":
        rejected = " ".join(rng.choice(fragments.neutral[:100]) for _ in range(rng.randint(1, 2)))
    else:
        rejected = junk(rng, 6)
    if rng.random() < 0.4:
        chosen, rejected = junk(rng, 3) + chosen + junk(rng, 3), junk(rng, 3) + rejected + junk(rng, 3)
    return chosen, rejected


def mixed_answer(rng: random.Random, fragments: Fragments) -> str:
    """English and Chinese words in one answer, in either order: wrong for an English question ("水是water。")."""
    pieces = [fragments.text(rng, "en", rng.randint(1, 3)), fragments.text(rng, "zh", rng.randint(1, 2))]
    rng.shuffle(pieces)
    return rng.choice(("", " ")).join(pieces)


def make_pair(rng: random.Random, question: str, fragments: Fragments) -> tuple[str, str]:
    """(chosen, rejected) completions for `question` with the same layout and think text: the chosen answer is in
    the question's language, the rejected one in the other language, only numbers/punctuation, junk (tags,
    newlines, broken characters) or, for an English question, English mixed with Chinese (`MIXED_RATIO`): each is
    what a policy found to exploit a reward model trained without it. Both may carry junk around the words."""
    chosen, rejected = answer_pair(rng, question, fragments)
    if not CJK.search(question) and rng.random() < MIXED_RATIO:  # half of them lines the warm start teaches
        taught = fragments.mixed and rng.random() < 0.5
        rejected = rng.choice(fragments.mixed) if taught else mixed_answer(rng, fragments)
    layout = rng.random()
    if layout < 0.3:  # answer-only conversations: what the 0.6 answer term scores
        return chosen, rejected
    think = fragments.noise(rng, rng.randint(0, 5))
    tags = ("<think>\n{t}\n</think>\n<answer>\n{a}\n</answer>" if layout < 0.8 else
            rng.choice(["<think>\n{t}\n<answer>\n{a}\n</answer>",
                        "<think>\n{t}</think>\n<answer>\n{a}</answer>\n</answer>",
                        "{t}\n<answer>\n{a}\n</answer>", "<think>\n{t}\n</think>\n{a}"]))
    return tags.format(t=think, a=chosen), tags.format(t=think, a=rejected)


def make_pairs(questions: list[str], fragments: Fragments, count: int, seed: int) -> list[tuple[str, str, str]]:
    """`count` (question, chosen, rejected) triples; the chosen has the property, the rejected does not."""
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < count:
        question = rng.choice(questions)
        chosen, rejected = make_pair(rng, question, fragments)
        if in_question_language(question, chosen) and not in_question_language(question, rejected):
            pairs.append((question, chosen, rejected))
    return pairs


# --------------------------------------------------------------------------- training


def conversation(question: str, completion: str, context=None) -> list[dict]:
    """What `RewardModelReward` scores: MiniMind's default system turn, the question, the completion."""
    from ..models.minimind.tokenization_minimind import DEFAULT_SYSTEM_PROMPT

    return [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": question},
            {"role": "assistant", "content": completion}]


@dataclass(frozen=True)
class PairLayout:
    """How one generation's reward term asks the reward model: `make_pairs(questions, fragments, count, seed)`
    gives `(question, chosen, rejected, context)` tuples and `conversation(question, completion, context)` the
    messages the reward model scores (`context`: what else the prompt held, e.g. MiniMind-3's system prompt).

    `center_rewards_coefficient` is TRL's `RewardConfig` term, coefficient x mean((r_chosen + r_rejected)^2): it
    centres each pair's scores on 0, so a question's good answers score above 0 and its bad ones below, whatever
    its language. Bradley-Terry alone leaves a free offset per question, and the seed's demo model learnt one per
    language (raw scores: English questions +2 to +7 for good and bad answers alike, Chinese -7 to +0.5) that the
    reward's +-3 clip then flattened: English questions gave GRPO almost no signal about the answer's language.
    0.01 is TRL's suggested value."""

    make_pairs: Callable
    conversation: Callable
    center_rewards_coefficient: float = 0.01


def _minimind2_pairs(questions, fragments, count, seed):
    return [(question, chosen, rejected, None) for question, chosen, rejected in
            make_pairs(questions, fragments, count, seed)]


# the seed's RewardModelReward (whole completion)
MINIMIND2_PAIRS = PairLayout(_minimind2_pairs, conversation)


def pairwise_accuracy(scorer, pairs, layout: PairLayout = MINIMIND2_PAIRS) -> float:
    """Share of pairs whose chosen completion the scorer scores above the rejected one."""
    chosen = scorer.score([layout.conversation(q, c, x) for q, c, _, x in pairs])
    rejected = scorer.score([layout.conversation(q, r, x) for q, _, r, x in pairs])
    return sum(c > r for c, r in zip(chosen, rejected)) / len(pairs)


def train_reward_model(output: Path, questions: list[str], held_out: list[str], texts: list[str], *, seed: int = 0,
                       steps: int = 200, batch_size: int = 32, learning_rate: float = 3e-3, log=print,
                       layout: PairLayout = MINIMIND2_PAIRS) -> dict:
    """Write a tiny InternLM2 reward-model folder at `output`, train it on generated pairs (shown to it as `layout`
    says: MiniMind2's whole completion after the prompt's turns, or MiniMind-3's answer after the folded turn),
    save it in the published layout (loaded back strictly by the native loader) and return its report (held-out
    pairwise accuracy)."""
    import torch
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from ..models.internlm2_reward import load_internlm2_reward_model, load_internlm2_tokenizer
    from ..models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from ..rewards.scorers import InternLM2Scorer, pad_token_ids

    started = time.time()
    torch.manual_seed(seed)
    write_tiny_internlm2_reward_model(output, seed=seed, **REWARD_MODEL_CONFIG)
    model = load_internlm2_reward_model(output).requires_grad_(True).train()
    tokenizer = load_internlm2_tokenizer(output)
    scorer = InternLM2Scorer(model, tokenizer, batch_size=64)
    fragments = Fragments.from_texts(texts)
    train_pairs = layout.make_pairs(questions, fragments, steps * batch_size, seed)
    test_pairs = layout.make_pairs(held_out, fragments, 512, seed + 1)

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    pad = tokenizer.pad_token_id
    bar = tqdm(total=steps, desc="Reward model", unit="step", dynamic_ncols=True)  # as the demo's other stages
    for step in range(steps):
        batch = train_pairs[step * batch_size : (step + 1) * batch_size]
        ids = [scorer.token_ids(layout.conversation(q, c, x)) for q, c, _, x in batch] + [
            scorer.token_ids(layout.conversation(q, r, x)) for q, _, r, x in batch
        ]
        input_ids, attention_mask = pad_token_ids(ids, pad, "right")
        scores = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=(attention_mask.cumsum(-1) - 1).clamp(min=0)).logits[:, 0]
        margin = scores[: len(batch)] - scores[len(batch) :]
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        pair_sums = scores[: len(batch)] + scores[len(batch) :]
        loss = loss + layout.center_rewards_coefficient * pair_sums.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        bar.update()
        if log and (step + 1) % 50 == 0:
            log(f"reward model step {step + 1}/{steps}: loss {loss.item():.3f}, "
                f"train accuracy {(margin > 0).float().mean().item():.2f}")
    bar.close()

    model.eval().requires_grad_(False)
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(output / "model.safetensors"), metadata={"format": "pt"})
    reloaded = InternLM2Scorer.from_pretrained(output)  # strictly, as the GRPO run will load it
    report = {
        "prefers": CONTENT_METRIC,
        "held_out_pairwise_accuracy": pairwise_accuracy(reloaded, test_pairs, layout),
        "held_out_pairs": len(test_pairs),
        "train_pairs": len(train_pairs),
        "steps": steps,
        "center_rewards_coefficient": layout.center_rewards_coefficient,
        "seed": seed,
        "seconds": round(time.time() - started, 1),
    }
    (output / "reward_model.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def bundled_texts() -> tuple[list[str], list[str], list[str]]:
    """(train questions, held-out questions, reply texts) from the demo's bundled data."""
    from .model import FORMAT_EXAMPLES_FILE, PROMPTS_FILE, read_conversations

    questions = [turns[0]["content"] for turns in read_conversations(PROMPTS_FILE)]
    replies = [turns[-1]["content"] for turns in read_conversations(FORMAT_EXAMPLES_FILE)]
    train, held_out = split_prompts(questions)
    return train, held_out, questions + replies


def prepare_full_reward(reward_model_dir: Path, prompts_file: Path, seed: int, steps: int,
                        layout: PairLayout = MINIMIND2_PAIRS, asked: str = "") -> dict:
    """`--rewards full`: train the reward model into `reward_model_dir` on the training prompts, write those prompts
    (the bundled ones less the held-out ones) as GRPO's dataset, print what was done; return the model's report.
    `asked` says how the pairs were shown to it (printed)."""
    train, held_out, texts = bundled_texts()
    report = train_reward_model(reward_model_dir, train, held_out, texts, seed=seed, steps=steps, log=None,
                                layout=layout)
    print(
        f"Reward model: tiny InternLM2 layout (InternLM2ForRewardModel, SentencePiece tokenizer) trained in "
        f"{report['seconds']:.0f}s on {report['train_pairs']} generated pairs{asked} to prefer the {CONTENT_METRIC}; "
        f"held-out pairwise accuracy {report['held_out_pairwise_accuracy']:.1%}."
    )
    with prompts_file.open("w", encoding="utf-8") as handle:
        for prompt in train:
            turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}]
            handle.write(json.dumps({"conversations": turns}, ensure_ascii=False) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="folder to write the reward model into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    train, held_out, texts = bundled_texts()
    report = train_reward_model(args.output, train, held_out, texts, seed=args.seed, steps=args.steps)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
