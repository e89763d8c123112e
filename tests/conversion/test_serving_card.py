"""The model card an export writes names the `vllm serve` flags tool calling needs, and only when the folder's
tokenizer can serve tool calls (`<tool_call>`/`</tool_call>` tokens, a chat template that renders `tools`)."""

import pytest

from minimind_trl.demos import agent_task as task
from minimind_trl.cli import main as cli
from minimind_trl.demos.model import build_model, save_folder
from minimind_trl.conversion.serving_card import TOOL_CALL_FLAGS, serves_tool_calls
from minimind_trl.models.minimind.tokenization_minimind import MINIMIND3_CHAT_TEMPLATE, build_minimind_tokenizer


@pytest.fixture(scope="module")
def agent_tokenizer():
    return task.build_agent_tokenizer(task.make_questions(0, 40))


def exported_card(tokenizer, root, name="agent-qwen3") -> str:
    save_folder(build_model(len(tokenizer), task.MODEL, generation="minimind3"), tokenizer, root / "minimind")
    assert cli(["export", str(root / "minimind"), str(root / name), "--format", "qwen3"]) == 0
    return (root / name / "README.md").read_text(encoding="utf-8")


def test_an_agent_export_names_the_tool_call_flags(agent_tokenizer, tmp_path):
    card = exported_card(agent_tokenizer, tmp_path)
    assert f"vllm serve agent-qwen3 {TOOL_CALL_FLAGS}" in card
    assert TOOL_CALL_FLAGS == "--enable-auto-tool-choice --tool-call-parser hermes"
    assert "Qwen3ForCausalLM" in card


def test_without_the_tool_tokens_the_card_offers_no_tool_calling(tmp_path):
    tokenizer = build_minimind_tokenizer(generation="minimind3")  # MiniMind-3's template, no <tool_call> tokens
    assert not serves_tool_calls(tokenizer)
    card = exported_card(tokenizer, tmp_path)
    assert "vllm serve agent-qwen3\n" in card and "--tool-call-parser" not in card


def test_a_template_that_drops_the_tools_serves_no_tool_calls(agent_tokenizer):
    assert serves_tool_calls(agent_tokenizer)
    broken = task.build_agent_tokenizer(task.make_questions(0, 40))
    broken.chat_template = MINIMIND3_CHAT_TEMPLATE.replace("{{- tool | tojson }}", "")
    assert not serves_tool_calls(broken)
