"""`compile_generation`: rollouts through transformers' static cache and a compiled forward, which TRL's trainer
never enables; the settings it cannot go with are refused by name."""

import copy
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from minimind_trl.errors import RecipeError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOTrainer
from minimind_trl.trainer.speed.compiled_generation import compile_generation

from trainer_fixtures import grpo_config, tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def reward(completions, **kwargs):
    return [float(len(str(c)) % 3) for c in completions]


def trainer_for(tokenizer, tmp_path, use_moe=False, callbacks=None, max_steps=1, **overrides):
    """Prompts cut to their last 6 tokens (`grpo_config`'s `max_prompt_length`): every rollout has the same shapes."""
    rows = [{"prompt": [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}]} for i in range(4)]
    args = grpo_config(tmp_path, max_steps=max_steps, save_strategy="no", **overrides)
    return MiniMindGRPOTrainer(tiny_model(tokenizer, use_moe=use_moe), reward_funcs=[reward], args=args,
                               processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
                               callbacks=callbacks)  # fmt: skip


class CountGraphs(TrainerCallback):
    """The graphs torch.compile has built so far, at the end of each step."""

    def __init__(self):
        self.per_step = []

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_rollouts_run_through_the_static_cache_and_the_compiled_forward(tokenizer, tmp_path, mode):
    """Compiled at the first rollout, never again while the shapes stay (3 steps); greedy decoding through the compiled
    forward gives the eager forward's tokens."""
    counter = CountGraphs()
    trainer = trainer_for(tokenizer, tmp_path, callbacks=[counter], max_steps=3, compile_generation=mode)
    config = trainer.generation_config
    assert config.cache_implementation == "static" and config.disable_compile is False
    assert config.compile_config.mode == mode and trainer._sampler is None  # stock generate, not the lean loop
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    trainer.train()
    policy = trainer.accelerator.unwrap_model(trainer.model)
    assert getattr(policy, "_compiled_call", None) is not None  # generate compiled the forward and ran it
    assert trainer.state.global_step == 3 and counter.per_step[0] > before
    assert counter.per_step[1:] == [counter.per_step[0]] * 2, counter.per_step  # no recompilation after the first
    prompt = tokenizer(["Question 5: what is"], return_tensors="pt")
    greedy = copy.deepcopy(config)  # the trainer's own config, its compile switch included
    greedy.update(do_sample=False, max_new_tokens=6, min_new_tokens=6)
    eager = copy.deepcopy(greedy)
    eager.disable_compile = True
    compiled_tokens = policy.generate(**prompt, generation_config=greedy)
    assert torch.equal(compiled_tokens, policy.generate(**prompt, generation_config=eager))


def test_a_moe_policy_compiles_in_pieces_and_trains(tokenizer, tmp_path):
    trainer = trainer_for(tokenizer, tmp_path, use_moe=True, compile_generation="default")
    trainer.train()
    assert getattr(trainer.accelerator.unwrap_model(trainer.model), "_compiled_call", None) is not None


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
        ({"compile_generation": "default", "activation_checkpointing": True}, "activation_checkpointing"),
        ({"compile_generation": "default", "gradient_checkpointing": True}, "activation_checkpointing"),
        ({"compile_generation": "default", "sampling_weights_dtype": "bfloat16"}, "lean sampler's"),
        ({"compile_generation": "default", "generation_kwargs": {"cache_implementation": "dynamic"}},
         "sets cache_implementation itself"),
    ],
)
def test_settings_it_cannot_go_with_are_refused_by_name(tmp_path, overrides, named):
    with pytest.raises(RecipeError, match=named):
        grpo_config(tmp_path, **overrides)


@pytest.mark.parametrize("zero_stage, fsdp", [(3, False), (None, True)])
def test_zero3_and_fsdp_are_refused_by_the_trainer(zero_stage, fsdp):
    plugin = SimpleNamespace(zero_stage=zero_stage) if zero_stage else None
    trainer = SimpleNamespace(args=SimpleNamespace(compile_generation="default"), is_fsdp_enabled=fsdp,
                              is_deepspeed_enabled=plugin is not None,
                              accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)))  # fmt: skip
    with pytest.raises(RecipeError, match="ZeRO-3 or FSDP"):
        compile_generation(trainer)


def test_the_command_lines_none_is_unset(tmp_path):
    assert grpo_config(tmp_path, compile_generation="None").compile_generation is None
