"""What `MiniMindGRPOTrainer` substitutes inside `GRPOTrainer.__init__` (`trl_init_overrides`)."""

from datasets import Dataset
from transformers import AutoTokenizer

from conftest import FIXTURES, require_shared
from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.models.minimind.tokenization_minimind import MINIMIND_RESPONSE_TEMPLATE
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer


def multiply(a: int, b: int) -> int:
    """
    Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


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
