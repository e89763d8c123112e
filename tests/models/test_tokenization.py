"""Tokenizers: upstream's files load with AutoTokenizer; the offline builder matches MiniMind's conventions."""

import pytest
from conftest import FIXTURES, require_shared
from transformers import AutoTokenizer

from minimind_trl.models.minimind.tokenization_minimind import (
    DEFAULT_SYSTEM_PROMPT,
    MINIMIND_CHAT_TEMPLATE,
    REASONING_TAGS,
    build_minimind_tokenizer,
)

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
