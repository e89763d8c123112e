"""A MiniMind-style tokenizer built offline, for tests and the CPU demo.

Real runs use the tokenizer that ships with a MiniMind checkpoint. Tests and the demo cannot download
one, so this module trains a small byte-level BPE (the same family as MiniMind's) on a bundled or given
corpus and gives it MiniMind's specials and chat template:

* ids 0/1/2 are `<|endoftext|>` (pad, unk), `<|im_start|>` (bos) and `<|im_end|>` (eos), as upstream;
* the chat template is upstream MiniMind2's (fea69cf): ChatML with MiniMind's default system turn
  (`<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n`) when the conversation has none, and Qwen-style
  tool calls (`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`);
* optionally the reasoning tags `<think>`, `</think>`, `<answer>`, `</answer>` are single *non-special*
  tokens, so TRL's `skip_special_tokens=True` decoding keeps them in the text the rule rewards read.

`generation="minimind3"` builds MiniMind-3's (upstream d65ef2c) instead: its chat template (no default system turn;
the generation prompt opens a thought, `<think>\\n`, when rendered with `open_thinking=True`, else closes an empty
one), and `<think>`, `</think>` as single non-special tokens (MiniMind-3 has no `<answer>`). Its tool calls are
written the same way as MiniMind2's.

Every tokenizer built here, and every one this package loads and saves (`portable_tokenizer`: conversions, exports,
merged LoRA folders, trainer checkpoints), carries the `response_template` that reads those tool calls back
(`MINIMIND_RESPONSE_TEMPLATE`), which TRL's `GRPOTrainer` needs for `tools=` and `environment_factory`.

`PortableTokenizerFast` saves its files in the form upstream's own converter writes (`tokenizer_class:
PreTrainedTokenizerFast`, `extra_special_tokens: {}`), which transformers 4.57.x (upstream's pinned version),
5.x and llama.cpp's `convert_hf_to_gguf.py` all read; transformers 5 alone would write `TokenizersBackend` and a
list, which 4.57 cannot load.
"""

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant"

# MiniMind2's chat template (upstream fea69cf, `model/tokenizer_config.json`), verbatim: ChatML with MiniMind's default
# system turn, and Qwen-style tool calls (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`).
MINIMIND_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
 {%- if messages[0]['role'] == 'system' -%}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else -%}
        {{- '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}
 {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
   {{- '<|im_start|>' + message.role + '\n' + content }}
  {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

# MiniMind-3's chat template (upstream d65ef2c, `model/tokenizer_config.json`), verbatim: the demo and the tests
# render prompts exactly as upstream's tokenizer does without reading its files.
MINIMIND3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if true %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if open_thinking is defined and open_thinking is true %}
        {{- '<think>\n' }}
    {%- else %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
THINK_TAGS = ("<think>", "</think>")  # MiniMind-3's reasoning tags (added tokens, not special)
CHAT_TEMPLATES = {"minimind2": MINIMIND_CHAT_TEMPLATE, "minimind3": MINIMIND3_CHAT_TEMPLATE}
GENERATION_TAGS = {"minimind2": REASONING_TAGS, "minimind3": THINK_TAGS}

# How a MiniMind reply reads back as a message (transformers' `response_template`, which `tokenizer.parse_response`
# and TRL's tool loop use): both generations write Qwen-style turns, so the fields are Qwen3's: an optional
# `<think>` block, any number of `<tool_call>{json}</tool_call>` blocks, the text up to `<|im_end|>`. transformers
# saves it in `tokenizer_config.json` and loads it back with the tokenizer.
MINIMIND_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
_PROBE_CALL = {"type": "function", "function": {"name": "probe_tool", "arguments": {"value": 1}}}


def writes_minimind_tool_calls(tokenizer) -> bool:
    """Whether `tokenizer`'s chat template writes an assistant tool call that `MINIMIND_RESPONSE_TEMPLATE` reads back
    as the same call: rendered after the generation prompt, parsed with that prompt as the prefix (as TRL's tool loop
    parses a completion). True for both upstream generations' templates; False without a chat template, for one that
    cannot render tool calls (e.g. MiniMind2's before fea69cf) or writes them another way."""
    from jinja2 import TemplateError

    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return False
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}]
    try:
        prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
        turn = tokenizer.apply_chat_template(messages, tokenize=False)
    except (TemplateError, TypeError):  # a template that refuses tool calls (or dict arguments) has none to parse
        return False
    if not turn.startswith(prompt):
        return False
    parsed = tokenizer.parse_response(turn[len(prompt) :], MINIMIND_RESPONSE_TEMPLATE, prefix=prompt)
    return parsed.get("tool_calls") == [_PROBE_CALL]


def attach_response_template(tokenizer):
    """`tokenizer` with `MINIMIND_RESPONSE_TEMPLATE` as its `response_template`, when it has none and its chat template
    writes tool calls that template parses (`writes_minimind_tool_calls`), so `tools=` and `environment_factory` work
    in TRL's `GRPOTrainer`, whose own table of templates knows no MiniMind one. Unchanged otherwise."""
    if getattr(tokenizer, "response_template", None) is None and writes_minimind_tool_calls(tokenizer):
        tokenizer.response_template = MINIMIND_RESPONSE_TEMPLATE
    return tokenizer


def attach_chat_format(tokenizer, generation: str = "minimind2"):
    """`tokenizer` with the generation's chat template (upstream's, verbatim) and the response template that parses
    its replies; what `build_minimind_tokenizer` gives every tokenizer it builds."""
    if generation not in CHAT_TEMPLATES:
        raise ValueError(f"generation must be one of {', '.join(CHAT_TEMPLATES)}, got {generation!r}")
    tokenizer.chat_template = CHAT_TEMPLATES[generation]
    return attach_response_template(tokenizer)

# A little bilingual text so the default tokenizer has sensible merges for both scripts.
_DEFAULT_CORPUS = (
    "You are a helpful assistant. Please think step by step, then answer.",
    "What is the capital of France? The capital of France is Paris.",
    "How many days are there in a week? There are seven days in a week.",
    "Explain why the sky is blue. Sunlight is scattered by the air, and blue light scatters the most.",
    "Write a short poem about the sea. The sea is wide, the waves are blue, the wind sings songs for me and you.",
    "What is two plus three? Two plus three equals five.",
    "请介绍一下你自己。我是一个乐于助人的人工智能助手。",
    "中国的首都是哪里？中国的首都是北京。",
    "一年有多少个月？一年有十二个月。",
    "请写一首关于春天的诗。春风吹绿了柳树，小鸟在枝头歌唱。",
    "为什么天空是蓝色的？因为阳光中的蓝光被空气散射得最多。",
    "一加一等于几？一加一等于二。",
)


def make_tokenizer_config_portable(path: str | Path) -> None:
    """Rewrite a saved `tokenizer_config.json` into the form transformers 4.57.x, 5.x and llama.cpp read.

    * `tokenizer_class`: transformers 5's `TokenizersBackend` (no such class in 4.57) -> `PreTrainedTokenizerFast`;
    * `extra_special_tokens`: 4.57 reads a dict of *named* model tokens; 5.x writes a list of extra specials. The
      list moves to `additional_special_tokens` (both versions read it), the named tokens
      (`model_specific_special_tokens`) become the dict;
    * the chat template is also inlined, as in MiniMind's own files (llama.cpp's converter and older loaders read
      it there; `chat_template.jinja` stays for transformers 5).
    """
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("tokenizer_class") in ("TokenizersBackend", "PortableTokenizerFast"):
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = data.get("extra_special_tokens")
    if isinstance(extra, list):
        if extra:
            data["additional_special_tokens"] = extra
        extra = None
    named = data.pop("model_specific_special_tokens", None) or {}
    data["extra_special_tokens"] = {**named, **(extra or {})}
    template = path.with_name(path.name.replace("tokenizer_config.json", "chat_template.jinja"))
    if "chat_template" not in data and template.is_file():
        data["chat_template"] = template.read_text(encoding="utf-8")
    for key in ("backend", "is_local", "local_files_only"):  # loading-time flags transformers 5 leaks into the file
        data.pop(key, None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


class PortableTokenizerFast(PreTrainedTokenizerFast):
    """transformers' fast tokenizer whose `save_pretrained` writes the portable form (`make_tokenizer_config_portable`).

    Used for every tokenizer minimind-trl loads or builds, so trainer checkpoints, Hub pushes, conversions,
    exports, merged LoRA folders and the demo all carry files that load without transformers 5.
    """

    def save_pretrained(self, save_directory, *args, push_to_hub: bool = False, **kwargs):
        if push_to_hub:  # rewrite before uploading: save, fix, then push the folder
            files = self.save_pretrained(save_directory, *args, **kwargs)
            repo_id = kwargs.pop("repo_id", str(save_directory).split("/")[-1])
            self.push_to_hub(repo_id, **{k: v for k, v in kwargs.items() if k in ("commit_message", "token", "private")})
            return files
        files = super().save_pretrained(save_directory, *args, **kwargs)
        prefix = kwargs.get("filename_prefix") or (args[1] if len(args) > 1 else None)
        make_tokenizer_config_portable(Path(save_directory) / f"{prefix + '-' if prefix else ''}tokenizer_config.json")
        return files


def portable_tokenizer(tokenizer):
    """`tokenizer` itself, saving in the portable form when it is transformers' plain fast tokenizer, and with the
    response template TRL's tool loop needs when its chat template writes MiniMind's tool calls
    (`attach_response_template`), so every folder this package writes carries it.

    Other classes (e.g. `Qwen2Tokenizer`) exist in both versions and keep theirs.
    """
    if type(tokenizer) is PreTrainedTokenizerFast:
        tokenizer.__class__ = PortableTokenizerFast
    return attach_response_template(tokenizer)


def build_minimind_tokenizer(
    corpus: Iterable[str] | None = None,
    vocab_size: int = 6400,
    reasoning_tags: bool = True,
    model_max_length: int = 32768,
    generation: str = "minimind2",
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with MiniMind's specials and chat template.

    Args:
        corpus: texts to learn merges from (a small built-in bilingual sample when None). Any text can be
            encoded whatever the corpus: byte-level BPE falls back to single bytes.
        vocab_size: upper bound on the vocabulary (a small corpus yields fewer merges).
        reasoning_tags: add the generation's reasoning tags as single non-special tokens (MiniMind2: `<think>`,
            `</think>`, `<answer>`, `</answer>`; MiniMind-3: `<think>`, `</think>`).
        model_max_length: recorded on the tokenizer.
        generation: `"minimind2"` (the seed's chat template) or `"minimind3"` (MiniMind-3's, with `open_thinking`).
    """
    if generation not in CHAT_TEMPLATES:
        raise ValueError(f"generation must be one of {', '.join(CHAT_TEMPLATES)}, got {generation!r}")
    texts = list(corpus) if corpus is not None else list(_DEFAULT_CORPUS)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if reasoning_tags:
        tokenizer.add_tokens(list(GENERATION_TAGS[generation]))
    fast = PortableTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    return attach_chat_format(fast, generation)


__all__ = [
    "MINIMIND_RESPONSE_TEMPLATE",
    "PortableTokenizerFast",
    "attach_chat_format",
    "attach_response_template",
    "writes_minimind_tool_calls",
    "make_tokenizer_config_portable",
    "portable_tokenizer",
    "build_minimind_tokenizer",
    "MINIMIND_CHAT_TEMPLATE",
    "MINIMIND3_CHAT_TEMPLATE",
    "THINK_TAGS",
    "DEFAULT_SYSTEM_PROMPT",
    "REASONING_TAGS",
]
