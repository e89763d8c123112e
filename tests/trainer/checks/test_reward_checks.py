"""What the trainer accepts as its reward source: reward functions, environments that own the reward (`get_reward`,
TRL's `environment_factory`), or both; with neither, one clear error before any model loads."""

import pytest
import torch
from datasets import Dataset

from minimind_trl.errors import RewardSpecError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.checks.reward_checks import check_trainer_arguments

from trainer_fixtures import tiny_model


class Counter:
    """An environment that owns its reward: the counter its one tool raised."""

    def reset(self, **kwargs):
        self.count = 0

    def increment(self, step: int) -> int:
        """
        Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The counter's new value.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return float(self.count)


class Unscored:
    """An environment whose rollouts need a reward function."""

    def reset(self, **kwargs):
        pass


def format_reward(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.parametrize(
    "environment_factory",
    [Counter, {"counter": Counter, "plain": Unscored}, lambda: Counter()],
    ids=["class", "dict", "callable"],
)
def test_environments_owning_the_reward_stand_in_for_reward_funcs(environment_factory):
    """TRL 1.16 takes `get_reward` as a reward source; a factory that is not a class is left to TRL to inspect."""
    for reward_funcs in (None, []):
        check_trainer_arguments(torch.nn.Linear(1, 1), reward_funcs, environment_factory)


@pytest.mark.parametrize("environment_factory", [None, Unscored, {"a": Unscored}], ids=["none", "class", "dict"])
def test_no_reward_source_is_refused_before_the_model_loads(tmp_path, environment_factory):
    """An empty folder as the policy: TRL would fail reading it, so the refusal comes first."""
    with pytest.raises(RewardSpecError, match="No reward source provided: pass reward_funcs"):
        MiniMindGRPOTrainer(model=str(tmp_path), reward_funcs=None, environment_factory=environment_factory)


def test_reward_funcs_keep_their_checks_beside_environments():
    with pytest.raises(TypeError, match="'format' is the name of a built-in reward"):
        check_trainer_arguments(torch.nn.Linear(1, 1), ["format"], Counter)
    check_trainer_arguments(torch.nn.Linear(1, 1), [format_reward], Unscored)


def test_an_environment_reward_trains_without_reward_funcs(tmp_path):
    """The agent setting end to end on MiniMind-3's tokenizer: no `reward_funcs`, an environment owning the reward,
    completions injected with `patch.object(trainer.model, "generate")`. The tool call is parsed (MiniMind's response
    template), runs in the environment, and its count is the reward the step learns from."""
    from unittest.mock import patch

    tokenizer = build_minimind_tokenizer(generation="minimind3")
    args = MiniMindGRPOConfig.trl_defaults(
        str(tmp_path / "out"),
        per_device_train_batch_size=3,
        num_generations=3,
        max_completion_length=256,
        max_steps=1,
        learning_rate=0.1,
        use_cpu=True,
        bf16=False,
        report_to="none",
    )
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Count to one."}]] * 3})
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer), args=args, train_dataset=prompts, processing_class=tokenizer, environment_factory=Counter
    )
    assert trainer.reward_func_names == ["Counter"]
    call = '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call><|im_end|>'
    first = [call, "No.<|im_end|>", "No.<|im_end|>"]
    calls = []

    def fake_generate(input_ids, **kwargs):
        texts = first if not calls else ["Done.<|im_end|>"] * input_ids.shape[0]
        calls.append(input_ids.shape[0])
        ids = [tokenizer(text)["input_ids"] for text in texts]
        width = max(map(len, ids))
        completions = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids])
        return torch.cat([input_ids, completions], dim=1)

    before = {name: p.clone() for name, p in trainer.model.named_parameters()}
    with patch.object(trainer.model, "generate", side_effect=fake_generate):
        trainer.train()
    assert calls == [3, 1]  # the three rollouts, then the one that called the tool
    logged = trainer.state.log_history[0]
    assert logged["tools/call_frequency"] == pytest.approx(1 / 3) and logged["tools/failure_frequency"] == 0
    assert logged["rewards/Counter/mean"] == pytest.approx(1 / 3)
    assert sorted(environment.count for environment in trainer.environments) == [0, 0, 1]
    assert any(not torch.equal(p, before[name]) for name, p in trainer.model.named_parameters())
