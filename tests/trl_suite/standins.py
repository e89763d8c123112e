"""Offline stand-ins for what TRL's GRPOTrainer tests fetch from the Hub: tiny MiniMind models for the
`trl-internal-testing/tiny-*` ids, written into a Hugging Face cache (`HF_HUB_CACHE`) so transformers finds them
offline, and the `trl-internal-testing/zen` prompts.

Each id has two snapshots, one per vocabulary layout (`use_layout` points the cache's `refs/main` at one):
* "minimind" (the default): the tokenizer `build_minimind_tokenizer` builds (MiniMind's specials at 0/1/2, its chat
  template and response template) and MiniMind's vocabulary size, 6400;
* "qwen", for the tests that inject completions as Qwen2.5 token ids through a fake `generate` (`<|im_end|>` is
  151645, `<tool_call>` 151657, `' {"'` 5212, ...): MiniMind's specials, chat template and response template on
  Qwen2.5's id layout, the 256 byte symbols at 0-255 in GPT-2's order (as Qwen's), the multi-byte pieces the tests
  write at the ids they use, the specials at Qwen's ids, and merges learned from the text the tests encode (at
  free ids). Its 151669-row vocabulary makes every step several times dearer, so only those tests get it.
"""

import json
from pathlib import Path

# Multi-byte pieces TRL's tests write as Qwen2.5 ids (single bytes need none: ids 0-255 are the byte symbols).
INJECTED_PIECES = {
    4913: '{"', 606: "name", 788: '":', 330: ' "', 64648: "multiply", 22785: "_tool", 497: '",', 16370: "arguments",
    5212: ' {"', 11248: "}}\n", 1513: " don", 944: "'t", 1414: " know", 894: " any", 5392: " tool", 7692: "async",
    93054: "_multiply", 17453: "Done", 35744: "increment", 9520: "step", 2765: " won", 927: "sh", 411: "out",
    1318: "text", 6023: "hi", 95642: '"}}\n', 450: "dec", 13477: "rement", 16252: " increment", 14172: "tool",
    6659: "call", 397: ">\n", 522: "</", 314: " {", 293: " b",
}  # fmt: skip
QWEN_SPECIAL_IDS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
QWEN_TAG_IDS = {"<tool_call>": 151657, "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666,
                "<think>": 151667, "</think>": 151668}  # fmt: skip
VOCAB_SIZES = {"minimind": 6400, "qwen": 151669}
LEARNED_IDS_FROM = 100000  # the qwen layout's learned merges: above every injected piece, below the specials
LAYOUTS = tuple(VOCAB_SIZES)
REVISIONS = {"minimind": "0" * 40, "qwen": "1" * 40}  # one snapshot per layout

# hub id -> (generation, head, MoE): the MiniMind standing in for it
STANDINS = {
    "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5": ("minimind2", "causal", False),
    "trl-internal-testing/tiny-Qwen3ForCausalLM": ("minimind3", "causal", False),
    "trl-internal-testing/tiny-Qwen3MoeForCausalLM": ("minimind3", "causal", True),
    "trl-internal-testing/tiny-Gemma2ForCausalLM": ("minimind2", "causal", False),
    "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5": ("minimind2", "classifier", False),
    "trl-internal-testing/tiny-Qwen3ForSequenceClassification": ("minimind3", "classifier", False),
    "trl-internal-testing/tiny-LlamaForSequenceClassification-3.2": ("minimind2", "classifier", False),
}


def multiply_tool(a: int, b: int) -> int:  # the tool of TRL's tool tests, so its schema is in the merges' corpus
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def _merges_corpus(generation: str) -> list[str]:
    """Text like what the tests encode: the chat template's renderings (with a tool), the zen prompts, tool errors."""
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    tokenizer = build_minimind_tokenizer(generation=generation)
    call = {"type": "function", "function": {"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}}
    conversation = [
        {"role": "user", "content": "What is 3 times 4?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply_tool", "content": '{"error": "got an unexpected keyword argument"}'},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=[multiply_tool], tokenize=False)
    return [rendered, *ZEN_PROMPTS, *ZEN_QUESTIONS, "missing 1 required positional argument"] * 4


def qwen_layout_tokenizer(generation: str):
    """MiniMind's specials, chat template and response template on Qwen2.5's ids (see the module docstring), with
    byte-level merges learned from `_merges_corpus` (at ids Qwen's pieces do not use) so prompts are about as long
    as with a real vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from minimind_trl.models.minimind.tokenization_minimind import PortableTokenizerFast, attach_chat_format

    # merges across words (no pre-tokenizer split): the chat template's fixed text becomes a few tokens, as the
    # test prompts would be with a real vocabulary's hundreds of thousands of words, so scoring them stays cheap
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = splitter
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=4096, initial_alphabet=alphabet, show_progress=False)
    learner.train_from_iterator(_merges_corpus(generation), trainer=trainer)
    learned = json.loads(learner.to_str())["model"]

    byte_symbols = bytes_to_unicode()
    vocab = {symbol: index for index, symbol in enumerate(byte_symbols.values())}
    for index, text in INJECTED_PIECES.items():
        vocab["".join(byte_symbols[b] for b in text.encode())] = index
    for piece in learned["vocab"]:
        vocab.setdefault(piece, LEARNED_IDS_FROM + len(vocab))
    vocab.update({**QWEN_SPECIAL_IDS, **QWEN_TAG_IDS})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(merge) for merge in learned["merges"]]))
    backend.pre_tokenizer = splitter
    backend.decoder = decoders.ByteLevel()
    tokenizer = PortableTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(QWEN_TAG_IDS))  # non-special, as in Qwen's and MiniMind-3's tokenizers
    return attach_chat_format(tokenizer, generation)


def standin_tokenizer(generation: str, layout: str):
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    if layout == "minimind":
        return build_minimind_tokenizer(generation=generation)
    return qwen_layout_tokenizer(generation)


def standin_model(generation: str, head: str, moe: bool, tokenizer, layout: str):
    """The smallest MiniMind of the generation: width 16, one layer, 2 heads (MoE: the generation's experts)."""
    import torch

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM, MiniMindForSequenceClassification

    config = MiniMindConfig(
        minimind_generation=generation,
        vocab_size=VOCAB_SIZES[layout],
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        use_moe=moe,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
    )
    torch.manual_seed(0)
    return (MiniMindForSequenceClassification if head == "classifier" else MiniMindForCausalLM)(config)


def _repo(cache: Path, repo_id: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}"


def build_hub_cache(cache: Path) -> None:
    """Every stand-in in both layouts, as the snapshots of its hub id in `cache`; `refs/main` at "minimind"."""
    for layout in LAYOUTS:
        tokenizers = {generation: standin_tokenizer(generation, layout) for generation in ("minimind2", "minimind3")}
        built = {}
        for repo_id, spec in STANDINS.items():
            snapshot = _repo(cache, repo_id) / "snapshots" / REVISIONS[layout]
            if spec in built:  # another id for the same MiniMind
                snapshot.parent.mkdir(parents=True, exist_ok=True)
                snapshot.symlink_to(built[spec], target_is_directory=True)
                continue
            tokenizer = tokenizers[spec[0]]
            standin_model(*spec, tokenizer, layout).save_pretrained(snapshot)
            tokenizer.save_pretrained(snapshot)
            built[spec] = snapshot
    use_layout(cache, "minimind")


def use_layout(cache: Path, layout: str) -> None:
    """Point every stand-in id at its `layout` snapshot (what transformers loads next)."""
    for repo_id in STANDINS:
        (_repo(cache, repo_id) / "refs").mkdir(parents=True, exist_ok=True)
        (_repo(cache, repo_id) / "refs" / "main").write_text(REVISIONS[layout])


# --- the zen dataset (trl-internal-testing/zen): 19 prompts, the last 2 the test split

# The Zen of Python, cut into prompts (standard) and turned into questions (conversational), 19 rows each
ZEN_PROMPTS = (
    "Beautiful is better than", "Explicit is", "Simple is better", "Complex", "Flat is better than",
    "Sparse is better", "Readability", "Special cases aren't special", "Although practicality beats",
    "Errors should never", "Unless explicitly", "In the face of ambiguity, refuse",
    "There should be one-- and preferably", "Although that way may not be obvious at first unless you're", "Now is",
    "Although never is often", "If the implementation is hard to explain,", "If the implementation is easy",
    "Namespaces are one honking great",
)  # fmt: skip
ZEN_QUESTIONS = (
    "What is better than ugly?", "What is better than implicit?", "What is better than complex?",
    "What is better than complicated?", "What is better than nested?", "What is better than dense?", "What counts?",
    "Are special cases enough to break the rules?", "What beats purity?", "What should never pass silently?",
    "When can errors pass silently?", "What should you do in the face of ambiguity?",
    "How many ways should there be to do it?", "For whom may the way not be obvious at first?",
    "What is better than never?", "Is never better than *right* now?",
    "What does it mean if the implementation is hard to explain?",
    "What does it mean if the implementation is easy to explain?", "Any great ideas?",
)  # fmt: skip
TEST_ROWS = 2


def zen_rows(config_name: str) -> list[dict]:
    if config_name == "standard_prompt_only":
        return [{"prompt": prompt} for prompt in ZEN_PROMPTS]
    if config_name == "conversational_prompt_only":
        return [{"prompt": [{"role": "user", "content": question}]} for question in ZEN_QUESTIONS]
    raise ValueError(f"no stand-in for trl-internal-testing/zen config {config_name!r}")


def write_zen(folder: Path) -> None:
    """One JSON-lines file per config and split (`<config>/<split>.jsonl`)."""
    for config_name in ("standard_prompt_only", "conversational_prompt_only"):
        rows = zen_rows(config_name)
        (folder / config_name).mkdir(parents=True, exist_ok=True)
        for split, part in (("train", rows[:-TEST_ROWS]), ("test", rows[-TEST_ROWS:])):
            with open(folder / config_name / f"{split}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(row) + "\n" for row in part)
