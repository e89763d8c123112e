"""The demo's MiniMind-3 ingredients (`demos.minimind3`): warm-start rows in MiniMind-3's layout that TRL's SFT
tokenizes as the policy will see them, the answer the content check reads, the reward model's pairs asked
MiniMind-3's way, and (slow) a reward model trained on them that prefers the question's language."""

import statistics

import pytest
from conftest import require_shared

from minimind_trl.demos import minimind3 as m3
from minimind_trl.demos.model import FORMAT_EXAMPLES_FILE, build_tokenizer, read_conversations
from minimind_trl.demos.reward_model import Fragments, bundled_texts
from minimind_trl.prompt_rendering import SYSTEM_PROMPTS
from minimind_trl.rewards.minimind3_rewards import HISTORY_SEPARATOR, think_close_count


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("minimind3")


def test_warm_start_rows_are_the_examples_in_minimind3s_layout(tokenizer):
    """Each row renders (as TRL's SFT renders it, with the row's `chat_template_kwargs`) to the prompt GRPO would
    render plus the completion: `thought\\n</think>\\n\\nanswer` after an open thought, the answer after a closed
    one."""
    conversations = read_conversations(FORMAT_EXAMPLES_FILE)
    rows = m3.warm_start_rows(conversations, 0.9, seed=3)
    assert len(rows) == len(conversations)
    opened = [row["chat_template_kwargs"]["open_thinking"] for row in rows]
    assert 0.8 < sum(opened) / len(rows) < 0.97 and not all(opened)
    assert opened != [row["chat_template_kwargs"]["open_thinking"] for row in m3.warm_start_rows(conversations, 0.9, 4)]
    for row, turns in zip(rows, conversations):
        kwargs = row["chat_template_kwargs"]
        prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True, **kwargs)
        full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False, **kwargs)
        assert full.startswith(prompt)
        completion = full[len(prompt) :]
        thought, answer = turns[-1]["content"].split("\n</think>\n<answer>\n")
        thought, answer = thought.removeprefix("<think>\n"), answer.removesuffix("\n</answer>")
        if kwargs["open_thinking"]:
            assert prompt.endswith("<|im_start|>assistant\n<think>\n")
            assert completion == f"{thought}\n</think>\n\n{answer}<|im_end|>\n"
            assert m3.has_layout(completion.removesuffix("<|im_end|>\n"))
        else:
            assert prompt.endswith("<think>\n\n</think>\n\n") and completion == f"{answer}<|im_end|>\n"
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert tokenizer(full, add_special_tokens=False)["input_ids"][: len(prompt_ids)] == prompt_ids


def test_the_answer_is_what_follows_the_first_think_close():
    assert m3.answer_text("想一想\n</think>\n\n巴黎") == "巴黎"
    assert m3.answer_text("a\n</think>\n\nParis </think> x") == "Paris   x"  # later tags are not language
    assert m3.answer_text("Paris") == "Paris"  # no </think>: the whole completion
    assert m3.in_question_language("法国的首都是哪里？", "The capital is Paris.\n</think>\n\n巴黎")
    assert not m3.in_question_language("法国的首都是哪里？", "法国的首都是巴黎。\n</think>\n\nParis")
    assert not m3.in_question_language("What is 7 plus 5?", "7 + 5 = 12\n</think>\n\n")
    assert m3.has_layout("a\n</think>\n\nb") and not m3.has_layout("a\n</think>\n\n</think>\n\nb")
    assert not m3.has_layout("a b c") and not m3.has_layout("a\n</think>\n\n")


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42])  # the demo passes its --seed: every one
def test_pairs_are_asked_minimind3s_way_and_differ_in_the_property_only(seed):
    train, _, texts = bundled_texts()
    pairs = m3.make_pairs(train, Fragments.from_texts(texts), 300, seed=seed)
    assert len(pairs) == 300
    with_system = [pair for pair in pairs if pair[3] is not None]
    assert 0.35 < len(with_system) / len(pairs) < 0.65 and {pair[3] for pair in with_system} <= set(SYSTEM_PROMPTS)
    for question, chosen, rejected, system_prompt in pairs:  # the answers as the term shows them: all after </think>
        assert m3.in_question_language(question, "</think>" + chosen)
        assert not m3.in_question_language(question, "</think>" + rejected)
        user, assistant = m3.conversation(question, chosen, system_prompt)
        assert (user["role"], assistant) == ("user", {"role": "assistant", "content": chosen.strip()})
        if system_prompt is None:
            assert user["content"] == question
        else:  # upstream's fold: the system turn as history, then the new question
            assert user["content"] == f"system: {system_prompt}{HISTORY_SEPARATOR}{question}"


def test_some_pairs_are_as_long_as_a_whole_completion():
    """Once the policy stops closing its thought, MiniMind-3's term scores the whole completion (up to 32 tokens):
    the pairs hold answers that long, in the question's language against the other one."""
    train, _, texts = bundled_texts()
    pairs = [(q, unpadded(c), unpadded(r), x)
             for q, c, r, x in m3.make_pairs(train, Fragments.from_texts(texts), 600, seed=0)]
    long = [pair for pair in pairs if len(pair[1]) >= 20 and len(pair[2]) >= 20]
    assert 0.2 <= len(long) / len(pairs) <= 0.4, len(long)  # 6 % of them without the long pairs
    # English filler against the same filler with a Chinese piece or two in it (what lingers of the warm start's
    # Chinese thought words in a collapsed policy's English answers)
    sprinkled = [(chosen, rejected) for question, chosen, rejected, _ in long
                 if not m3.CJK.search(question + chosen) and m3.CJK.search(rejected) and m3.CJK.sub("", rejected) == chosen]
    assert len(sprinkled) >= 0.2 * len(long), (len(sprinkled), len(long))


def unpadded(answer: str) -> str:
    """An answer without the newlines and reasoning tags `minimind3.padded` puts in."""
    return m3.TAGS.sub("", answer).replace("\n", "")


@pytest.mark.parametrize("seed", [0, 6, 42])
def test_some_answers_are_padded_and_some_rejected_ones_are_only_padding(seed):
    """A padding policy writes newlines and `</think>` after its first `</think>`: the pairs show the reward model
    both answers padded, and rejected answers that are nothing but padding (whatever the question's language)."""
    train, _, texts = bundled_texts()
    pairs = m3.make_pairs(train, Fragments.from_texts(texts), 1000, seed=seed)
    padded = [pair for pair in pairs if unpadded(pair[1]) != pair[1] and unpadded(pair[2]) != pair[2]]
    only_padding = [pair for pair in pairs if pair[2] and not unpadded(pair[2]).strip()]
    assert 0.3 <= len(padded) / len(pairs) <= 0.6, len(padded)
    assert 0.15 <= len(only_padding) / len(pairs) <= 0.3, len(only_padding)
    for language in (True, False):  # Chinese and English questions alike
        assert sum(bool(m3.CJK.search(q)) == language and "</think>" in r for q, _, r, _ in only_padding) >= 20


def test_pairs_fold_as_the_reward_term_folds_a_rendered_prompt(tokenizer):
    """What the reward model is trained on is what `AnswerRewardModelReward` asks it about a rendered prompt."""
    from minimind_trl.rewards.minimind3_rewards import AnswerRewardModelReward

    class Recorder:
        def score(self, conversations):
            self.seen = conversations
            return [0.0] * len(conversations)

    recorder = Recorder()
    term = AnswerRewardModelReward(recorder)
    system, question, answer = SYSTEM_PROMPTS[3], "狗有几条腿？", "四条"
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        tokenize=False, add_generation_prompt=True, open_thinking=True,
    )  # fmt: skip
    term([prompt, prompt], [f"想一想\n</think>\n\n{answer}", answer])
    assert recorder.seen == [m3.conversation(question, answer, system)] * 2


def test_the_overlong_term_punishes_completions_near_the_demos_cap_only():
    """DAPO's soft overlong punishment at the demo's 32 tokens: 0 up to 24, then linearly down to -1 at the cap."""
    ids = [[7] * length for length in (3, 24, 28, 32)]
    assert m3.overlong_punishment(completion_ids=ids) == [0.0, 0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match="completion_ids"):
        m3.overlong_punishment(prompts=["q"], completions=["a"])


def test_the_demo_recipe_names_the_overlong_term_at_its_completion_length():
    from minimind_trl.cli.recipe import parse_recipe
    from minimind_trl.demos.default import GRPO_MINIMIND3_RECIPE, PROMPTS_FILE

    script_args, training_args, _, _ = parse_recipe(
        GRPO_MINIMIND3_RECIPE, {"dataset_name": str(PROMPTS_FILE), "output_dir": "unused"}
    )
    assert script_args.reward_funcs[-1] == "minimind_trl.demos.minimind3:overlong_punishment"
    assert training_args.max_completion_length == m3.MAX_COMPLETION_LENGTH
    assert len(training_args.reward_weights) == len(script_args.reward_funcs)


def test_the_four_rule_terms_see_one_think_close_in_the_warm_start_completions():
    rows = m3.warm_start_rows(read_conversations(FORMAT_EXAMPLES_FILE), 1.0, seed=0)
    replies = [row["completion"][0]["content"] for row in rows]
    assert set(think_close_count([""] * len(replies), replies)) == {0.25}


@pytest.mark.slow
def test_reward_model_asked_minimind3s_way_prefers_the_question_language(tmp_path):
    """The demo's reward-model training on MiniMind-3 pairs (seed 0, the demo's 200 steps): >= 90 % pairwise accuracy
    on held-out prompts, both with a folded system prompt and without."""
    from minimind_trl.demos.reward_model import pairwise_accuracy, train_reward_model
    from minimind_trl.rewards.scorers import InternLM2Scorer

    train, held_out, texts = bundled_texts()
    report = train_reward_model(tmp_path / "rm", train, held_out, texts, seed=0, log=None, layout=m3.PAIRS)
    assert report["held_out_pairwise_accuracy"] >= 0.9, report
    scorer = InternLM2Scorer.from_pretrained(tmp_path / "rm")
    pairs = m3.make_pairs(held_out, Fragments.from_texts(texts), 512, seed=1)
    for with_system in (True, False):
        subset = [pair for pair in pairs if (pair[3] is not None) == with_system]
        assert pairwise_accuracy(scorer, subset, m3.PAIRS) >= 0.9, with_system
    # answers as long as a whole completion: the filler a collapsed policy writes, scored by its language too
    long = [pair for pair in pairs if len(unpadded(pair[1])) >= 20 and len(unpadded(pair[2])) >= 20]
    assert len(long) > 50 and pairwise_accuracy(scorer, long, m3.PAIRS) >= 0.9
    # a bare run of newlines and tags is a wrong answer in either language ("think" is not English)
    only_padding = [pair for pair in pairs if not unpadded(pair[2]).strip()]
    assert len(only_padding) > 50 and pairwise_accuracy(scorer, only_padding, m3.PAIRS) >= 0.9
    # centred: a question's right answer scores above 0 and its wrong one below, in either language, so the
    # reward's +-3 clip does not flatten one language's answers
    for english in (True, False):
        subset = [pair for pair in pairs if (m3.CJK.search(pair[0]) is None) == english]
        chosen = scorer.score([m3.conversation(q, c, x) for q, c, _, x in subset])
        rejected = scorer.score([m3.conversation(q, r, x) for q, _, r, x in subset])
        assert statistics.median(chosen) > 0 > statistics.median(rejected), english


def test_upstream_tokenizer_folds_the_same_prompt(tokenizer):
    """The demo's tokenizer renders prompts as MiniMind-3's own does, so its folds are upstream's."""
    from transformers import AutoTokenizer

    from conftest import FIXTURES

    upstream = AutoTokenizer.from_pretrained(require_shared(FIXTURES / "MiniMind-3" / "tokenizer"))
    messages = [{"role": "system", "content": SYSTEM_PROMPTS[0]}, {"role": "user", "content": "What is 7 plus 5?"}]
    for open_thinking in (True, False):
        kwargs = dict(tokenize=False, add_generation_prompt=True, open_thinking=open_thinking)
        assert tokenizer.apply_chat_template(messages, **kwargs) == upstream.apply_chat_template(messages, **kwargs)
