"""Tokenizers: upstream's files load with AutoTokenizer; the offline builder matches MiniMind's conventions."""

import pytest
from conftest import FIXTURES, require_shared
from transformers import AutoTokenizer

from minimind_trl.models.minimind.tokenization_minimind import (
    DEFAULT_SYSTEM_PROMPT,
    MINIMIND_CHAT_TEMPLATE,
    MINIMIND_RESPONSE_TEMPLATE,
    REASONING_TAGS,
    build_minimind_tokenizer,
    portable_tokenizer,
    writes_minimind_tool_calls,
)
from grpo_fixtures import multiply

CONVERSATIONS = [
    [{"role": "user", "content": "中国的首都是哪里？"}],
    [{"role": "system", "content": "你是一个数学老师。"}, {"role": "user", "content": "What is 2 + 3?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
]


@pytest.mark.parametrize("era", ["MiniMind2", "MiniMind-3"])
def test_upstream_tokenizer_files_load_and_render_minimind_chat(era):
    tokenizer = AutoTokenizer.from_pretrained(require_shared(FIXTURES / era / "tokenizer"))
    assert len(tokenizer) == 6400
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 2)
    rendered = tokenizer.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\n中国的首都是哪里？<|im_end|>\n<|im_start|>assistant\n" in rendered
    if era == "MiniMind2":  # MiniMind2's template inserts its default system turn
        assert rendered.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n")
    text = "你好, MiniMind! 1 + 1 = 2"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_built_template_renders_like_minimind2_upstream():
    upstream = AutoTokenizer.from_pretrained(require_shared(FIXTURES / "MiniMind2" / "tokenizer"))
    built = build_minimind_tokenizer()
    for conversation in CONVERSATIONS:
        for generation_prompt in (False, True):
            kwargs = dict(tokenize=False, add_generation_prompt=generation_prompt)
            assert built.apply_chat_template(conversation, **kwargs) == upstream.apply_chat_template(
                conversation, **kwargs
            )


def test_built_tokenizer_specials_tags_and_round_trip(tmp_path):
    tokenizer = build_minimind_tokenizer(corpus=["think then answer 思考然后回答"] * 3, vocab_size=400)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert len(tokenizer) <= 400 + len(REASONING_TAGS)
    completion = "<think>\n先想一想\n</think>\n<answer>\nParis, 巴黎\n</answer>"
    ids = tokenizer(completion)["input_ids"]
    for tag in REASONING_TAGS:  # each tag is one token, and it survives skip_special_tokens decoding
        assert ids.count(tokenizer.convert_tokens_to_ids(tag)) == 1
    assert tokenizer.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == completion
    # any text encodes (byte-level fallback), even characters the corpus never had
    assert tokenizer.decode(tokenizer("ünïcødé ✓ 🚀")["input_ids"]) == "ünïcødé ✓ 🚀"

    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(completion)["input_ids"] == ids
    assert reloaded.chat_template == MINIMIND_CHAT_TEMPLATE


def test_without_reasoning_tags_the_tags_are_several_pieces():
    tokenizer = build_minimind_tokenizer(reasoning_tags=False)
    assert len(tokenizer("<think>")["input_ids"]) > 1


# --------------------------------------------------------------------------- MiniMind-3 (generation="minimind3")


def test_built_minimind3_template_is_upstreams_and_renders_the_fixture_prompts():
    """The shipped template is MiniMind-3's file verbatim, and renders every fixture conversation (both
    `open_thinking` choices) to the prompt upstream's tokenizer rendered."""
    import json

    from conftest import SHARED

    from minimind_trl.models.minimind.tokenization_minimind import MINIMIND3_CHAT_TEMPLATE

    upstream = AutoTokenizer.from_pretrained(require_shared(FIXTURES / "MiniMind-3" / "tokenizer"))
    built = build_minimind_tokenizer(generation="minimind3")
    assert built.chat_template == MINIMIND3_CHAT_TEMPLATE == upstream.chat_template
    cases = [json.loads(line) for line in (SHARED / "fixtures" / "minimind3-grpo" / "rewards.jsonl").open()]
    for case in cases:
        rendered = built.apply_chat_template(
            case["conversation"], tokenize=False, add_generation_prompt=True, open_thinking=case["open_thinking"]
        )
        assert rendered == case["prompt"], case["case"]
    assert {case["open_thinking"] for case in cases} == {True, False}


def test_built_minimind3_tokenizer_has_think_tags_only_and_no_default_system_turn(tmp_path):
    from minimind_trl.models.minimind.tokenization_minimind import THINK_TAGS

    tokenizer = build_minimind_tokenizer(generation="minimind3")
    for tag in THINK_TAGS:
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1
    assert len(tokenizer("<answer>", add_special_tokens=False)["input_ids"]) > 1  # MiniMind-3 has no <answer>
    completion = "先想一想\n</think>\n\nParis"
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == completion  # </think> survives TRL's decoding
    user = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True, open_thinking=True) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == tokenizer.chat_template
    with pytest.raises(ValueError, match="minimind2, minimind3"):
        build_minimind_tokenizer(generation="minimind4")


# --------------------------------------------------------------------------- tool calls (TRL's tool loop)


TOOL_CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}
TOOL_CONVERSATION = [
    {"role": "user", "content": "What is 3 x 4?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "name": "multiply", "content": "12"},
]


@pytest.mark.parametrize("generation, era", [("minimind2", "MiniMind2"), ("minimind3", "MiniMind-3")])
def test_built_templates_are_upstreams_with_its_tool_calls(generation, era):
    """Both generations' templates are upstream's files verbatim (MiniMind2's since fea69cf renders tools too)."""
    upstream = AutoTokenizer.from_pretrained(require_shared(FIXTURES / era / "tokenizer"))
    built = build_minimind_tokenizer(generation=generation)
    assert built.chat_template == upstream.chat_template
    rendered = built.apply_chat_template(TOOL_CONVERSATION, tools=[multiply], tokenize=False)
    assert '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>' in rendered


@pytest.mark.parametrize("generation", ["minimind2", "minimind3"])
def test_trl_parses_the_tool_calls_of_built_tokenizers(generation, tmp_path):
    """TRL's own `parse_response` (what its tool loop calls on each completion, after the prompt) reads the call back,
    also from the saved folder, and the answer and the thought of a reply without one."""
    from trl.chat_template_utils import parse_response, supports_tool_calling

    tokenizer = build_minimind_tokenizer(generation=generation)
    tokenizer.save_pretrained(tmp_path)
    for loaded in (tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        assert loaded.response_template == MINIMIND_RESPONSE_TEMPLATE and supports_tool_calling(loaded)
        prompt = loaded.apply_chat_template(
            TOOL_CONVERSATION[:1], tools=[multiply], tokenize=True, add_generation_prompt=True, return_dict=False
        )
        call = loaded('<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>')
        parsed = parse_response(loaded, call["input_ids"], prefix=prompt, tools=[multiply])
        assert parsed["tool_calls"] == [TOOL_CALL] and parsed["content"] == ""
        answer = loaded("<think>\nthree fours\n</think>\n\n12<|im_end|>")["input_ids"]
        parsed = parse_response(loaded, answer, prefix=prompt, tools=[multiply])
        assert (parsed["reasoning_content"], parsed["content"], "tool_calls" in parsed) == ("three fours", "12", False)


def test_trls_grpo_trainer_takes_tools_with_a_built_tokenizer(tmp_path):
    """Stock TRL: `GRPOTrainer(tools=...)` refuses any tokenizer whose chat template its table does not know
    ("Unrecognized chat template") unless it carries a response template."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    tokenizer = build_minimind_tokenizer(generation="minimind3")
    config = MiniMindConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, vocab_size=len(tokenizer))
    trainer = GRPOTrainer(
        model=MiniMindForCausalLM(config),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=GRPOConfig(str(tmp_path), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "3 x 4?"}]] * 8}),
        processing_class=tokenizer,
        tools=[multiply],
    )
    assert [tool.__name__ for tool in trainer.tools] == ["multiply"]


@pytest.mark.parametrize("era", ["MiniMind2", "MiniMind-3"])
def test_upstream_tokenizers_get_the_response_template_when_loaded_by_the_package(era):
    """Upstream's folders carry none; what the package loads (convert, export, the CLI's policy) gets it, and only a
    template that writes MiniMind's tool calls does (MiniMind2's before fea69cf renders no tools)."""
    upstream = AutoTokenizer.from_pretrained(require_shared(FIXTURES / era / "tokenizer"))
    assert getattr(upstream, "response_template", None) is None
    assert portable_tokenizer(upstream).response_template == MINIMIND_RESPONSE_TEMPLATE
    no_tools = build_minimind_tokenizer()
    no_tools.response_template = None
    no_tools.chat_template = OLD_MINIMIND2_TEMPLATE
    assert not writes_minimind_tool_calls(no_tools)
    assert portable_tokenizer(no_tools).response_template is None


# MiniMind2's template before upstream 4e35fb9 (2025-10-17) added tool calls: ChatML without them
OLD_MINIMIND2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
