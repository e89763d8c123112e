"""What `MiniMindGRPOTrainer` substitutes inside `GRPOTrainer.__init__` (`trl_init_overrides`)."""

from datasets import Dataset
from transformers import AutoTokenizer

from conftest import FIXTURES, require_shared
from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.models.minimind.tokenization_minimind import MINIMIND_RESPONSE_TEMPLATE
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from grpo_fixtures import multiply


def test_tools_work_with_an_upstream_tokenizer_loaded_as_it_is(tmp_path):
    """An upstream MiniMind folder's tokenizer, loaded with plain `AutoTokenizer` (no response template), gets
    MiniMind's where TRL's `add_response_schema` would refuse its chat template."""
    tokenizer = AutoTokenizer.from_pretrained(require_shared(FIXTURES / "MiniMind-3" / "tokenizer"))
    assert getattr(tokenizer, "response_template", None) is None
    config = MiniMindConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, vocab_size=len(tokenizer))
    trainer = MiniMindGRPOTrainer(
        MiniMindForCausalLM(config),
        lambda completions, **kwargs: [0.0] * len(completions),
        MiniMindGRPOConfig.trl_defaults(str(tmp_path), use_cpu=True, bf16=False, report_to="none"),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "3 x 4?"}]] * 8}),
        processing_class=tokenizer,
        tools=[multiply],
    )
    assert trainer.processing_class.response_template == MINIMIND_RESPONSE_TEMPLATE


def test_reward_functions_get_the_whole_decoded_completion_unless_tools_run(tmp_path):
    """A MiniMind tokenizer carries a response template, which TRL parses completions with: the thought would move to
    `reasoning_content` and MiniMind's format reward would score the rest. Without tools the rewards get the whole
    text (as upstream's, and as TRL gives for a tokenizer without a template); with tools, TRL's parsed message."""
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.rewards import format_reward

    from trainer_fixtures import grpo_config, tiny_model

    text = "<think>\nthree fours\n</think>\n<answer>\n12\n</answer>"
    tokenizer = build_minimind_tokenizer()
    assert tokenizer.response_template is not None
    seen = {}
    for tools in ([], [multiply]):

        def recording_reward(completions, **kwargs):
            seen[bool(tools)] = completions[0]
            return [0.0] * len(completions)

        trainer = MiniMindGRPOTrainer(
            tiny_model(tokenizer), recording_reward, grpo_config(tmp_path, max_completion_length=64),
            train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "3 x 4?"}]] * 8}),
            processing_class=tokenizer, tools=tools or None,
        )  # fmt: skip
        completion = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        trainer._generate_single_turn = lambda prompt_ids, *args, **kwargs: ([completion] * len(prompt_ids), None)
        trainer._generate_and_score_completions([{"prompt": [{"role": "user", "content": "3 x 4?"}]}] * 8)
        assert trainer.processing_class.response_template is not None  # what is saved keeps it
    assert seen[False] == [{"role": "assistant", "content": text}]
    assert format_reward(["p"], [seen[False]]) == [0.5]  # upstream's layout, scored whole
    assert seen[True][0]["reasoning_content"].strip() == "three fours"  # TRL's parsed message with tools
