"""`compile_generation`: rollouts through transformers' static cache and a compiled forward, which TRL's trainer
never enables; the settings it cannot go with are refused by name."""

import pytest
from datasets import Dataset

from minimind_trl.errors import RecipeError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOTrainer

from trainer_fixtures import grpo_config, tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def reward(completions, **kwargs):
    return [float(len(str(c)) % 3) for c in completions]


def trainer_for(tokenizer, tmp_path, **overrides):
    rows = [{"prompt": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]} for i in range(4)]
    return MiniMindGRPOTrainer(tiny_model(tokenizer), reward_funcs=[reward], processing_class=tokenizer,
                               args=grpo_config(tmp_path, max_steps=1, save_strategy="no", **overrides),
                               train_dataset=Dataset.from_list(rows))  # fmt: skip


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_rollouts_run_through_the_static_cache_and_the_compiled_forward(tokenizer, tmp_path, mode):
    trainer = trainer_for(tokenizer, tmp_path, compile_generation=mode)
    config = trainer.generation_config
    assert config.cache_implementation == "static" and config.disable_compile is False
    assert config.compile_config.mode == mode and trainer._sampler is None  # stock generate, not the lean loop
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert getattr(policy, "_compiled_call", None) is not None  # generate compiled the forward and ran it
    assert trainer.state.global_step == 1


def test_unset_leaves_trls_generation_config_and_the_lean_sampler(tokenizer, tmp_path):
    trainer = trainer_for(tokenizer, tmp_path)
    assert trainer.generation_config.disable_compile is True and trainer.generation_config.cache_implementation is None
    assert trainer._sampler is not None


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"compile_generation": "fast"}, "compile_generation must be one of default, reduce-overhead"),
        ({"compile_generation": "default", "cache_implementation": "dynamic"}, "cache_implementation: static"),
        ({"compile_generation": "default", "use_transformers_continuous_batching": True}, "continuous_batching"),
        ({"compile_generation": "default", "use_vllm": True}, "use_vllm: true"),
    ],
)
def test_settings_it_cannot_go_with_are_refused_by_name(tmp_path, overrides, named):
    with pytest.raises(RecipeError, match=named):
        grpo_config(tmp_path, **overrides)


def test_the_command_lines_none_is_unset(tmp_path):
    assert grpo_config(tmp_path, compile_generation="None").compile_generation is None
