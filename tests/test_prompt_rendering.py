"""MiniMind-3's per-prompt rendering (`thinking_ratio`, the random system prompt): keyed choices, their
frequencies, the dataset transform, its checks, and real GRPO runs where the rewards must see the prompt the policy
generated from, and a resumed run must render what the uninterrupted one rendered."""

import json
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import SHARED, require_shared
from grpo_fixtures import PROBE_DIR_ENV, tiny_recipe

from minimind_trl.cli.recipe import parse_args
from minimind_trl.data import load_rlaif_dataset
from minimind_trl.errors import RecipeError
from minimind_trl.grpo import main
from minimind_trl.prompt_rendering import (
    ROW_COLUMN,
    SYSTEM_PROMPTS,
    PromptRenderer,
    PromptRendering,
    choose_open_thinking,
    choose_system_prompt,
    prompt_renderer,
    render_prompt,
    with_rendered_prompts,
)
from minimind_trl.rewards import parse_prompt_turns
from minimind_trl.trainer.checks.trainer_settings import check_rendering_settings
from minimind_trl.trainer.grpo_trainer import MiniMindGRPOTrainer

MINIMIND3_TOKENIZER = SHARED / "fixtures" / "minimind-upstream" / "MiniMind-3" / "tokenizer"
REWARDS_FILE = SHARED / "fixtures" / "minimind3-grpo" / "rewards.jsonl"  # conversation, open_thinking -> prompt
USER = [{"role": "user", "content": "hi"}]
WITH_SYSTEM = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def within_four_sigma(hits: int, trials: int, p: float) -> bool:
    return abs(hits / trials - p) <= 4 * math.sqrt(p * (1 - p) / trials)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(require_shared(MINIMIND3_TOKENIZER))


# --------------------------------------------------------------------------- the choices


def test_choices_are_a_function_of_seed_epoch_and_row():
    rendering = PromptRendering(thinking_ratio=0.5, system_prompt_ratio=0.5, seed=3)
    rows = range(500)

    def choices(rendering, epoch, order):
        return {row: (choose_open_thinking(rendering, epoch, row), choose_system_prompt(rendering, epoch, row, USER))
                for row in order}  # fmt: skip

    first = choices(rendering, 0, rows)
    assert first == choices(PromptRendering(thinking_ratio=0.5, system_prompt_ratio=0.5, seed=3), 0, reversed(rows))
    assert first != choices(PromptRendering(thinking_ratio=0.5, system_prompt_ratio=0.5, seed=4), 0, rows)
    assert first != choices(rendering, 1, rows)  # each epoch draws anew, as upstream's reads do
    # the two choices are independent streams: turning system prompts off leaves open_thinking as it was
    without_system = PromptRendering(thinking_ratio=0.5, seed=3)
    assert [choose_open_thinking(without_system, 0, row) for row in rows] == [first[row][0] for row in rows]


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_open_thinking_frequency_matches_thinking_ratio(ratio):
    rendering = PromptRendering(thinking_ratio=ratio, seed=0)
    trials = 20000
    hits = sum(choose_open_thinking(rendering, epoch, row) for epoch in range(2) for row in range(trials // 2))
    if ratio in (0.0, 1.0):
        assert hits == trials * ratio
    else:
        assert within_four_sigma(hits, trials, ratio), hits / trials


def test_system_prompt_frequency_and_choice():
    rendering = PromptRendering(system_prompt_ratio=0.2, seed=0)
    trials = 20000
    added = [choose_system_prompt(rendering, 0, row, USER) for row in range(trials)]
    picked = Counter(prompt for prompt in added if prompt is not None)
    assert within_four_sigma(sum(picked.values()), trials, 0.2)
    assert set(picked) == set(SYSTEM_PROMPTS) and len(SYSTEM_PROMPTS) == 10
    assert all(within_four_sigma(count, sum(picked.values()), 0.1) for count in picked.values()), picked
    # never for a conversation that has a system turn, never with the ratio at 0
    assert all(choose_system_prompt(rendering, 0, row, WITH_SYSTEM) is None for row in range(1000))
    assert all(choose_system_prompt(PromptRendering(seed=0), 0, row, USER) is None for row in range(1000))
    assert choose_open_thinking(rendering, 0, 0) is None  # thinking_ratio off: no open_thinking passed


@pytest.mark.parametrize("key, value", [("thinking_ratio", 1.5), ("thinking_ratio", -0.1), ("system_prompt_ratio", 2)])
def test_ratios_out_of_range_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"{key} must be a number between 0 and 1, got {value}"):
        PromptRendering(**{key: value})


def test_recipe_ratios_are_checked_when_parsing(tmp_path):
    recipe = tiny_recipe(tmp_path, tmp_path / "policy", tmp_path / "data.jsonl", thinking_ratio=1.2)
    with pytest.raises(RecipeError, match=r"recipe.yaml:\d+: thinking_ratio: must be between 0 and 1 or unset"):
        parse_args(["--config", str(recipe)])
    recipe = tiny_recipe(tmp_path, tmp_path / "policy", tmp_path / "data.jsonl")
    with pytest.raises(RecipeError, match="--system_prompt_ratio nan: must be between 0 and 1"):
        parse_args(["--config", str(recipe), "--thinking_ratio", "0.9", "--system_prompt_ratio", "nan"])
    script_args, *_ = parse_args(["--config", str(recipe), "--thinking_ratio", "0.9"])
    assert script_args.thinking_ratio == 0.9 and script_args.system_prompt_ratio == 0.0


def test_defaults_leave_the_seed_path_alone(tmp_path):
    """MiniMind2's path: no per-prompt choice, and `minimind-trl grpo` hands TRL the conversational dataset as is."""
    from minimind_trl.cli.run_plan import prompt_rendering
    from minimind_trl.prompt_rendering import render_per_prompt

    recipe = tiny_recipe(tmp_path, tmp_path / "policy", tmp_path / "data.jsonl")
    script_args, training_args, _, _ = parse_args(["--config", str(recipe)])
    assert script_args.thinking_ratio is None and script_args.system_prompt_ratio == 0.0
    assert script_args.dataset_roles == "position"
    dataset = object()
    rendering = prompt_rendering(script_args, training_args)
    assert render_per_prompt(dataset, None, rendering, training_args.chat_template_kwargs) is dataset


def test_rendering_each_fixture_conversation_gives_upstreams_prompt(tokenizer):
    """Every case of fixtures/minimind3-grpo/rewards.jsonl renders to upstream's prompt, through `render_prompt`
    and through the dataset transform with the choice forced (thinking_ratio 1 or 0)."""
    forced = {
        flag: PromptRenderer(tokenizer, PromptRendering(thinking_ratio=1.0 if flag else 0.0)) for flag in (True, False)
    }
    lines = require_shared(REWARDS_FILE).read_text(encoding="utf-8").splitlines()
    cases = [json.loads(line) for line in lines if line.strip()]
    assert cases
    for row, case in enumerate(cases):
        assert render_prompt(tokenizer, case["conversation"], open_thinking=case["open_thinking"]) == case["prompt"]
        rendered = forced[case["open_thinking"]].render_row(case["conversation"], row)
        assert rendered == {"prompt": case["prompt"], "open_thinking": case["open_thinking"], "system_prompt": None}


# --------------------------------------------------------------------------- the dataset transform


def write_conversations(path: Path, conversations: list[list[dict]]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for conversation in conversations:
            f.write(json.dumps({"conversations": conversation}, ensure_ascii=False) + "\n")
    return path


CONVERSATIONS = [
    [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "reference"}] for i in range(6)
] + [
    WITH_SYSTEM + [{"role": "assistant", "content": "a"}],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "reference"},
    ],
]


def test_rendered_dataset_rows(tokenizer, tmp_path):
    dataset = load_rlaif_dataset(write_conversations(tmp_path / "d.jsonl", CONVERSATIONS), roles="data")
    rendering = PromptRendering(thinking_ratio=0.5, system_prompt_ratio=0.5, seed=11)
    rendered = with_rendered_prompts(dataset, tokenizer, rendering)
    renderer = prompt_renderer(rendered)
    assert isinstance(renderer, PromptRenderer) and prompt_renderer(dataset) is None

    def expected(row, epoch):
        messages = dataset[row]["prompt"]
        system = choose_system_prompt(rendering, epoch, row, messages)
        messages = ([{"role": "system", "content": system}] if system else []) + messages
        open_thinking = choose_open_thinking(rendering, epoch, row)
        prompt = render_prompt(tokenizer, messages, open_thinking=open_thinking)
        answer = dataset[row]["answer"]
        choices = {"open_thinking": open_thinking, "system_prompt": system}
        return {"prompt": prompt, "answer": answer, ROW_COLUMN: row, **choices}

    epochs = {}
    for epoch in (0, 1):
        renderer.set_epoch(epoch)
        rows = [rendered[row] for row in range(len(dataset))]
        assert rows == [expected(row, epoch) for row in range(len(dataset))]
        assert rendered.__getitems__([3, 1]) == [rows[3], rows[1]]  # the DataLoader's batched read
        epochs[epoch] = rows
    assert epochs[0] != epochs[1]
    assert all(isinstance(row["prompt"], str) for row in epochs[0])
    assert {row["open_thinking"] for row in epochs[0] + epochs[1]} == {True, False}
    assert any(row["system_prompt"] for row in epochs[0] + epochs[1])
    assert epochs[0][6]["system_prompt"] is None and epochs[1][6]["system_prompt"] is None  # has its own
    # the rewards' view of a rendered prompt: its turns, the open generation turn not among them
    assert parse_prompt_turns(epochs[0][7]["prompt"])[-1] == {"role": "user", "content": "second"}


def test_rendering_refusals(tokenizer, tmp_path):
    from tokenizers.processors import TemplateProcessing

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    dataset = load_rlaif_dataset(write_conversations(tmp_path / "d.jsonl", CONVERSATIONS), roles="data")
    thinking = PromptRendering(thinking_ratio=0.9)
    with pytest.raises(RecipeError, match="needs a chat template that reads `open_thinking`"):
        with_rendered_prompts(dataset, build_minimind_tokenizer(), thinking)  # MiniMind2's template
    with pytest.raises(RecipeError, match="chat_template_kwargs also sets open_thinking=True; drop one"):
        with_rendered_prompts(dataset, tokenizer, thinking, {"open_thinking": True})
    text_prompts = dataset.map(lambda row: {"prompt": "plain text"})
    with pytest.raises(RecipeError, match="the dataset's first prompt is str 'plain text', not a list of messages"):
        with_rendered_prompts(text_prompts, tokenizer, thinking)
    with_bos = tokenizer.__class__.from_pretrained(MINIMIND3_TOKENIZER)
    with_bos.backend_tokenizer.post_processor = TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", with_bos.convert_tokens_to_ids("<|im_start|>"))]
    )
    with pytest.raises(RecipeError, match="this tokenizer adds some"):
        with_rendered_prompts(dataset, with_bos, thinking)

    def settings(remove_unused_columns=False, dataloader_num_workers=0, dataloader_persistent_workers=False):
        return SimpleNamespace(**locals())

    with pytest.raises(RecipeError, match="set dataloader_persistent_workers: false"):
        check_rendering_settings(thinking, settings(dataloader_num_workers=2, dataloader_persistent_workers=True))
    with pytest.raises(RecipeError, match="set remove_unused_columns: false"):
        check_rendering_settings(thinking, settings(remove_unused_columns=True))
    check_rendering_settings(thinking, settings())
    check_rendering_settings(PromptRendering(), settings(remove_unused_columns=True))  # nothing rendered per prompt


# --------------------------------------------------------------------------- real GRPO runs


def build_minimind3_policy(folder: Path, tokenizer) -> Path:
    """A random tiny MiniMind with MiniMind-3's tokenizer and chat template."""
    import torch

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    config = MiniMindConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=64, vocab_size=len(tokenizer), max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    MiniMindForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def probed(folder: Path, kind: str) -> list[dict]:
    return [json.loads(line) for line in (folder / f"{kind}-rank0.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("prompt-rendering")
    return SimpleNamespace(
        policy=build_minimind3_policy(root / "policy", tokenizer),
        data=write_conversations(root / "rlaif.jsonl", CONVERSATIONS),
    )


RENDERING = dict(thinking_ratio=0.5, system_prompt_ratio=0.5, dataset_roles="data", max_prompt_length=None)


def test_rewards_see_the_prompt_the_policy_generated_from(setup, tokenizer, tmp_path, monkeypatch):
    """Every MiniMind-3 term runs and is logged; the reward functions get, as text, exactly the tokens the policy
    generated from, with both open_thinking choices and an added system prompt among them."""
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model

    seen_by_policy = []
    tokenize = MiniMindGRPOTrainer._tokenize_prompts

    def recording(self, prompts):
        prompt_ids, images, fields = tokenize(self, prompts)
        seen_by_policy.append([self.processing_class.decode(ids) for ids in prompt_ids])
        return prompt_ids, images, fields

    monkeypatch.setattr(MiniMindGRPOTrainer, "_tokenize_prompts", recording)
    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path))
    terms = ["length", "thinking_length", "think_close_count", "repetition_penalty", "answer_reward_model"]
    recipe = tiny_recipe(
        tmp_path, setup.policy, setup.data, max_steps=3, save_strategy="steps", save_steps=3,
        reward_funcs=terms + ["grpo_fixtures:token_reward"],
        reward_model_name_or_path=str(write_tiny_internlm2_reward_model(tmp_path / "rm")), **RENDERING,
    )  # fmt: skip
    assert main(["--config", str(recipe)]) == 0

    seen_by_rewards = [row["prompts"] for row in probed(tmp_path, "rewards")]
    assert len(seen_by_rewards) == 3 and seen_by_rewards == seen_by_policy
    prompts = [prompt for step in seen_by_rewards for prompt in step]
    assert any(prompt.endswith("<|im_start|>assistant\n<think>\n") for prompt in prompts)  # open_thinking
    assert any(prompt.endswith("</think>\n\n") for prompt in prompts)  # closed
    assert any(any(system in prompt for system in SYSTEM_PROMPTS) for prompt in prompts)
    state = json.loads((tmp_path / "out" / "checkpoint-3" / "trainer_state.json").read_text())
    logged = [entry for entry in state["log_history"] if "reward" in entry]
    assert all(math.isfinite(entry[f"rewards/{term}/mean"]) for entry in logged for term in terms)


def test_a_resume_renders_the_prompts_of_the_uninterrupted_run(setup, tmp_path, monkeypatch):
    """8 prompts, 2 per step: 4 steps an epoch. Resumed at step 5 (the second epoch), step 6 must render what the
    uninterrupted run rendered; and the second epoch renders some rows differently from the first."""
    settings = dict(max_steps=6, num_train_epochs=2, save_strategy="steps", save_steps=5, **RENDERING)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    resumed.mkdir()
    monkeypatch.setenv(PROBE_DIR_ENV, str(straight))
    assert main(["--config", str(tiny_recipe(straight, setup.policy, setup.data, **settings))]) == 0
    monkeypatch.setenv(PROBE_DIR_ENV, str(resumed))
    checkpoint = str(straight / "out" / "checkpoint-5")
    recipe = tiny_recipe(resumed, setup.policy, setup.data, **settings)
    assert main(["--config", str(recipe), "--resume_from_checkpoint", checkpoint]) == 0

    straight_rows = probed(straight, "rewards")
    (after_resume,) = probed(resumed, "rewards")
    assert after_resume == straight_rows[5]

    def by_question(rows):
        return {parse_prompt_turns(prompt)[-1]["content"]: prompt for row in rows for prompt in row["prompts"]}

    first_epoch, second_epoch = by_question(straight_rows[:4]), by_question(straight_rows[4:6])
    assert len(first_epoch) == 8
    assert any(second_epoch[question] != first_epoch[question] for question in second_epoch)


def test_the_command_refuses_thinking_ratio_with_a_template_without_open_thinking(tmp_path, capsys):
    """MiniMind2's tokenizer ignores `open_thinking`: one error line (exit 2) before the policy is loaded."""
    from grpo_fixtures import build_tiny_policy, write_rlaif

    recipe = tiny_recipe(tmp_path, build_tiny_policy(tmp_path / "policy"), write_rlaif(tmp_path / "d.jsonl"),
                         thinking_ratio=0.9)  # fmt: skip
    assert main(["--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "error: thinking_ratio=0.9 needs a chat template that reads `open_thinking`" in err
    assert "Traceback" not in err


def test_the_rendered_datasets_fingerprint_is_the_tokenizers_content_not_its_path(tmp_path, monkeypatch):
    """A resume names the tokenizer folder however it likes (trailing slash, relative path, symlink); the data it
    renders is the same, and so must be the fingerprint `minimind_run.json` compares."""
    import os

    from grpo_fixtures import write_rlaif
    from transformers import AutoTokenizer

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    build_minimind_tokenizer().save_pretrained(tmp_path / "tok")
    os.symlink(tmp_path / "tok", tmp_path / "link")
    dataset = load_rlaif_dataset(write_rlaif(tmp_path / "d.jsonl"))
    rendering = PromptRendering(system_prompt_ratio=0.2)
    spellings = [str(tmp_path / "tok"), str(tmp_path / "tok") + "/", str(tmp_path / "link"), "tok"]
    monkeypatch.chdir(tmp_path)
    prints = {with_rendered_prompts(dataset, AutoTokenizer.from_pretrained(name), rendering)._fingerprint
              for name in spellings}  # fmt: skip
    assert len(prints) == 1
    other = AutoTokenizer.from_pretrained(tmp_path / "tok")
    other.chat_template = other.chat_template + " "
    assert with_rendered_prompts(dataset, other, rendering)._fingerprint not in prints
    assert with_rendered_prompts(dataset, other, PromptRendering(system_prompt_ratio=0.3))._fingerprint not in prints


@pytest.mark.parametrize("setting, fragment", [
    ({"remove_unused_columns": True}, "set remove_unused_columns: false"),
    ({"dataloader_num_workers": 1, "dataloader_persistent_workers": True}, "set dataloader_persistent_workers: false"),
])  # fmt: skip
def test_the_python_api_refuses_settings_a_rendered_dataset_cannot_run_with(tmp_path, setting, fragment):
    """The CLI refused them; a Python run got `KeyError: 'prompt_row'`, or epoch 0's choices in epoch 1."""
    from grpo_fixtures import build_tiny_policy, write_rlaif

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.trainer import MiniMindGRPOConfig

    tokenizer = build_minimind_tokenizer()
    dataset = with_rendered_prompts(load_rlaif_dataset(write_rlaif(tmp_path / "d.jsonl")), tokenizer,
                                    PromptRendering(system_prompt_ratio=0.2))  # fmt: skip
    args = MiniMindGRPOConfig(str(tmp_path / "out"), use_cpu=True, bf16=False, **setting)
    with pytest.raises(RecipeError, match=fragment):
        MiniMindGRPOTrainer(str(build_tiny_policy(tmp_path / "policy")), reward_funcs=[lambda **k: [0.0]], args=args,
                            train_dataset=dataset, processing_class=tokenizer)  # fmt: skip
