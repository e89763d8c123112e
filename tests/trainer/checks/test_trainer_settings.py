"""`trainer_settings`: what the trainer checks of its own arguments before TRL builds anything."""

import datasets
import pytest
from grpo_fixtures import build_tiny_policy
from trainer_fixtures import grpo_config

from minimind_trl.errors import RecipeError
from minimind_trl.trainer import MiniMindGRPOTrainer


def test_evaluating_without_held_out_prompts_is_one_line_saying_where_they_come_from(tmp_path):
    """transformers' own `ValueError` ("you didn't pass an eval_dataset") never reaches a user: the trainer refuses
    first, naming the setting and where held-out prompts come from."""
    policy = build_tiny_policy(tmp_path / "policy")
    prompts = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "hi"}]}] * 4)
    args = grpo_config(tmp_path, eval_strategy="steps", eval_steps=1)
    with pytest.raises(RecipeError) as error:
        MiniMindGRPOTrainer(str(policy), reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                            train_dataset=prompts)
    message = str(error.value)
    assert message.startswith("eval_strategy='steps' evaluates on held-out prompts, but there are none: pass")
    assert "dataset_test_split, eval_dataset_name or a mixture's test_split_size" in message and "\n" not in message
