"""docs/agent.md's round trip without a server (the Serving section's transformers block), run as written on a
fresh model of the demo's shape and tokenizer: the prompt `apply_chat_template(..., tools=...)` renders is, token
for token, the one the demo trains on; a written call read by the block's `tool_turns` renders back to the call, the
tool's result and the next generation prompt exactly as the rollout builds them. Whether a trained model then
calls and answers is checked against the real server in tests/vllm_engine/test_agent_serving.py."""

import json
import os

import pytest
from serving_docs import python_blocks

from minimind_trl.agent import load_toolbox, observation_ids
from minimind_trl.agent.rollout import render_ids
from minimind_trl.demos import agent_task as task
from minimind_trl.demos.model import build_model, save_folder

CALL = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "37+48"}}\n</tool_call>'


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The block executed verbatim in a folder holding a fresh `minimind-trl-demo-agent` (what its last line
    loads): its namespace and what it printed."""
    root = tmp_path_factory.mktemp("serving-example")
    tokenizer = task.build_agent_tokenizer(task.make_questions(0, 40))
    save_folder(build_model(len(tokenizer), task.MODEL, generation="minimind3"), tokenizer,
                root / "minimind-trl-demo-agent")  # fmt: skip
    printed, namespace = [], {"__name__": "serving_example"}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("builtins.print", lambda *a, **k: printed.append(a))
            exec(compile(python_blocks()[1], "docs/agent.md:Serving", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace, printed, root / "minimind-trl-demo-agent"


def test_the_example_runs_on_a_saved_folder(example):
    namespace, printed, _ = example
    assert len(printed) == 1
    calls, text = printed[0][0]
    assert isinstance(calls, list) and isinstance(text, str)  # an untrained model: whatever it says, parsed


def test_its_prompt_is_the_one_the_demo_trains_on(example):
    from transformers import AutoTokenizer

    _, _, folder = example
    tokenizer = AutoTokenizer.from_pretrained(folder)
    question = task.Question(37, "+", 48, "zh")
    messages = [{"role": "system", "content": task.SYSTEM_PROMPT}, {"role": "user", "content": "计算 37+48"}]
    inputs = tokenizer.apply_chat_template(messages, tools=example[0]["TOOLS"], add_generation_prompt=True,
                                           return_dict=True)  # fmt: skip
    trained = render_ids(tokenizer, question.messages(), tools=task.TOOLS, template_kwargs={})
    assert inputs["input_ids"] == trained
    assert len(trained) < 30  # the system turn (tools block included) is the one added token it was trained as


def test_a_written_call_renders_back_as_the_rollout_built_it(example):
    from transformers import AutoTokenizer

    namespace, _, folder = example
    tokenizer = AutoTokenizer.from_pretrained(folder)
    toolbox = load_toolbox([task.TOOL])
    calls, follow = namespace["tool_turns"](CALL, toolbox)
    assert calls == [{"name": "calculate_math", "arguments": {"expression": "37+48"}}]
    assert follow[1] == {"role": "tool", "content": json.dumps({"result": "85"})}
    question = task.Question(37, "+", 48, "zh")
    prompt = question.messages()[:1] + [{"role": "user", "content": "计算 37+48"}]
    rendered = tokenizer.apply_chat_template(prompt + follow, tools=namespace["TOOLS"], add_generation_prompt=True,
                                             return_dict=True)["input_ids"]  # fmt: skip
    call_ids = tokenizer(CALL, add_special_tokens=False)["input_ids"]
    rollout = (render_ids(tokenizer, question.messages(), tools=task.TOOLS, template_kwargs={}) + call_ids
               + observation_ids(tokenizer, [follow[1]["content"]], template_kwargs={}, generation_prompt=True))
    assert rendered == rollout


def test_blocks_that_are_not_calls_never_reach_the_template(example):
    """`<tool_call>42` (or a list, or arguments that are not an object) made the template raise `TypeError`; the
    block's `tool_turns` render the well-formed call alone."""
    from transformers import AutoTokenizer

    namespace, _, folder = example
    tokenizer = AutoTokenizer.from_pretrained(folder)
    toolbox = load_toolbox([task.TOOL])
    junk = "".join(f"<tool_call>{block}</tool_call>" for block in
                   ("42", "[1, 2]", "null", '"calculate_math"', '{"name": "calculate_math", "arguments": [1]}'))
    prompt = [{"role": "system", "content": task.SYSTEM_PROMPT}, {"role": "user", "content": "计算 37+48"}]
    rendered = []
    for turn in (CALL + junk, junk + CALL, CALL):
        calls, follow = namespace["tool_turns"](turn, toolbox)
        assert calls == [{"name": "calculate_math", "arguments": {"expression": "37+48"}}]
        rendered.append(tokenizer.apply_chat_template(prompt + follow, tools=namespace["TOOLS"], tokenize=False))
    assert rendered[0] == rendered[1] == rendered[2]


def test_the_saved_folder_carries_what_a_server_needs(example):
    """A chat template that renders `tools`, `<tool_call>`/`</tool_call>` as single tokens that decoding keeps, and
    `<|im_end|>` as the generation config's EOS (where a served turn stops)."""
    from transformers import AutoTokenizer, GenerationConfig

    from minimind_trl.conversion.serving_card import TOOL_CALL_TOKENS, serves_tool_calls

    _, _, folder = example
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert serves_tool_calls(tokenizer)
    for tag in TOOL_CALL_TOKENS:
        ids = tokenizer(tag, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tokenizer.decode(ids, skip_special_tokens=True) == tag
    assert GenerationConfig.from_pretrained(folder).eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
