"""The model card (`README.md`) an export folder carries: what the folder is and how a serving engine runs it, with
the flags a consumer must pass.

A tokenizer that can serve tool calls (its vocabulary holds `<tool_call>` and `</tool_call>`, the tags vLLM's
`hermes` parser reads the calls between, and its chat template renders a request's `tools`) gets the OpenAI-server
command with tool calling: `vllm serve FOLDER --enable-auto-tool-choice --tool-call-parser hermes`
(docs/agent.md#serving). The folder's own chat template is used, so no `--chat-template`.
"""

import shlex
from pathlib import Path

from ..trainer.outputs.model_card import python_string

TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")
TOOL_CALL_FLAGS = "--enable-auto-tool-choice --tool-call-parser hermes"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_name", "description": "",
                                                "parameters": {"type": "object", "properties": {}}}}  # fmt: skip


def serves_tool_calls(tokenizer) -> bool:
    """Whether `tokenizer` has what an OpenAI server needs to take `tools` and parse calls: the two tags as tokens
    and a chat template that writes the offered tool into the prompt."""
    if tokenizer is None or not all(tag in tokenizer.get_vocab() for tag in TOOL_CALL_TOKENS):
        return False
    if not getattr(tokenizer, "chat_template", None):
        return False
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
    return _PROBE_TOOL["function"]["name"] in rendered


def shell_word(path: str | Path) -> str:
    """`path` as one shell word that pastes safely whatever its name (spaces, `;`, quotes, `$`): `shlex.quote`, and
    `./` before a relative path that starts with `-`, which a command would read as an option."""
    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def model_card(folder: str | Path, fmt: str, architecture: str, tokenizer, training: str | None = None) -> str:
    """The card's Markdown for an export of `fmt` (transformers class `architecture`) written to `folder` (its
    code blocks name it as given). `training`: the training card's run section (`model_card.run_record`) of the
    folder exported, kept so the export still says how the model was trained (rewards, loss, final metrics)."""
    name, served = Path(folder).name, shell_word(folder)
    lines = [
        f"# {name}",
        "",
        f"A MiniMind model exported by minimind-trl as `{architecture}` (`minimind-trl export --format {fmt}`): "
        "transformers' own class loads it with MiniMind's logits, no minimind-trl or remote code needed; vLLM and "
        "SGLang look the class up.",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM",
        f"model = AutoModelForCausalLM.from_pretrained({python_string(str(folder))})",
        "```",
        "",
        "## Serving",
        "",
    ]
    if serves_tool_calls(tokenizer):
        lines += [
            "Its tokenizer has `<tool_call>`/`</tool_call>` as tokens and a chat template that renders `tools`, so "
            "vLLM's OpenAI server takes `tools=[...]` and returns parsed `tool_calls` with the `hermes` parser (the "
            "folder's chat template is used; no `--chat-template`):",
            "",
            "```bash",
            f"vllm serve {served} {TOOL_CALL_FLAGS}",
            "```",
            "",
            "Send the tool's result back as a `tool` message, with the same `tools` offered again.",
        ]
    elif tokenizer is not None:
        lines += ["```bash", f"vllm serve {served}", "```", "",
                  "Its tokenizer has no `<tool_call>`/`</tool_call>` tokens or no chat template that renders `tools`: "
                  "served without tool calling."]  # fmt: skip
    else:
        lines += ["Exported without a tokenizer: copy the one the model was trained with into the folder before "
                  "serving it."]  # fmt: skip
    lines += ["", "See minimind-trl's docs/export.md and docs/agent.md (Serving).", ""]
    if training:
        lines += [training.rstrip(), ""]
    return "\n".join(lines)


__all__ = ["TOOL_CALL_FLAGS", "TOOL_CALL_TOKENS", "model_card", "serves_tool_calls", "shell_word"]
