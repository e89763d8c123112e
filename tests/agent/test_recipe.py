"""`check_agent_tokenizer`: a chat template the agent rollout cannot run on is refused with one line naming what it
lacks (tools, tool messages, `open_thinking` when `thinking_ratio` opens thoughts); MiniMind-3's passes, and so does
MiniMind2's (fea69cf's template reads tools) as long as no rollout opens a thought, and a MiniMind2 rollout then
shows the tools and the tool results."""

import json

import pytest

from minimind_trl.agent.recipe import check_agent_tokenizer
from minimind_trl.agent.rollout import AgentRollout
from minimind_trl.agent.tools import Toolbox
from minimind_trl.errors import RecipeError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

# ChatML without tools or tool messages (MiniMind2's template before fea69cf wrote none)
NO_TOOLS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# reads tools, drops tool messages
NO_TOOL_MESSAGES = ("{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
                    "{% for m in messages if m.role != 'tool' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizers():
    return {generation: build_minimind_tokenizer(generation=generation) for generation in ("minimind2", "minimind3")}


@pytest.mark.parametrize("thinking_ratio", [None, 0.0, 0.1, 1.0])
def test_minimind3_runs_agent_rollouts(tokenizers, thinking_ratio):
    check_agent_tokenizer(tokenizers["minimind3"], thinking_ratio)


@pytest.mark.parametrize("thinking_ratio", [None, 0.0])
def test_minimind2_runs_agent_rollouts_without_thoughts(tokenizers, thinking_ratio):
    check_agent_tokenizer(tokenizers["minimind2"], thinking_ratio)


def test_minimind2_is_refused_when_rollouts_open_thoughts(tokenizers):
    with pytest.raises(RecipeError, match=r"thinking_ratio=0\.1 .*ignores open_thinking"):
        check_agent_tokenizer(tokenizers["minimind2"], 0.1)


@pytest.mark.parametrize(
    "template, named",
    [(None, "has none"), (NO_TOOLS, "does not read `tools`"), (NO_TOOL_MESSAGES, "does not render them")],
)
def test_a_template_without_tool_turns_is_refused(template, named):
    tokenizer = build_minimind_tokenizer(generation="minimind3")
    tokenizer.chat_template = template
    with pytest.raises(RecipeError, match=named) as error:
        check_agent_tokenizer(tokenizer, None)
    assert "\n" not in str(error.value)


def test_a_minimind2_rollout_shows_the_tools_and_their_results(tokenizers):
    tokenizer = tokenizers["minimind2"]
    tools = [{"type": "function", "function": {"name": "calculate_math", "description": "math",
                                                "parameters": {"type": "object", "properties": {}}}}]
    prompt = [{"role": "system", "content": "", "tools": json.dumps(tools)}, {"role": "user", "content": "2*3?"}]
    call = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "2*3"}}\n</tool_call>'
    turns = iter([call, "6"])

    def generate(contexts):  # every turn is visited, the last with no rollout still going
        if not contexts:
            return [], None
        text = next(turns)
        return [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]] * len(contexts), None

    rollout = AgentRollout(Toolbox(), max_turns=3, max_total_length=None)
    transcript = rollout.start(tokenizer, prompt, None, {})
    rollout.run([transcript], tokenizer, generate, {})
    assert "calculate_math" in tokenizer.decode(transcript.prompt_ids)
    observed = [t for t, m in zip(transcript.response_ids, transcript.response_mask) if m == 0]
    assert '"result": "6"' in tokenizer.decode(observed)
    assert transcript.turn_outputs == [call, "6"] and transcript.tool_calls == 1 and transcript.tool_failures == 0


def test_the_documented_row_offers_the_documented_tool(tmp_path, monkeypatch):
    """docs/agent.md#a-row-offering-your-own-tool: its tool module, recipe lines and data row, read from the doc,
    load; the row's schema is the function's own; its toolbox runs the tool, and the mocks alone are refused."""
    import importlib

    import yaml
    from doc_blocks import doc_blocks
    from transformers.utils import get_json_schema

    from minimind_trl.agent.data import load_agent_dataset, sample_gt, sample_tools
    from minimind_trl.agent.recipe import check_offered_tools
    from minimind_trl.agent.tools import load_toolbox

    title = "A row offering your own tool"
    (module,), (recipe_lines,), (row,) = (doc_blocks("agent.md", title, kind, 1) for kind in ("python", "yaml", "json"))
    assert module.startswith("# mytools.py\n")
    (tmp_path / "mytools.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    mytools = importlib.import_module("mytools")
    data = tmp_path / "agent.jsonl"
    data.write_text(json.dumps(json.loads(row), ensure_ascii=False) + "\n", encoding="utf-8")
    dataset = load_agent_dataset(data)
    assert sample_tools(dataset[0]) == [get_json_schema(mytools.word_count)] and sample_gt(dataset[0]) == [4]

    recipe = yaml.safe_load(recipe_lines)
    assert recipe["rollout"] == "agent"
    toolbox = load_toolbox(recipe["agent_tools"], timeout=None)
    check_offered_tools(dataset, toolbox, str(data))
    outcome = toolbox.run_call({"name": "word_count", "arguments": {"text": "the quick brown fox"}})
    assert outcome.error is None and outcome.result == 4
    with pytest.raises(RecipeError, match="offer tools agent_tools does not run: 'word_count' \\(row 0 of 1\\)"):
        check_offered_tools(dataset, load_toolbox(None, timeout=None), str(data))


def calculate_math_schema(**changes) -> dict:
    """The mock's own schema with `changes` applied to its function entry (None removes a key)."""
    import copy

    from minimind_trl.agent.mock_tools import SCHEMAS

    schema = copy.deepcopy(SCHEMAS["calculate_math"])
    for path, value in changes.items():
        *parents, key = path.split("__")
        node = schema["function"]
        for parent in parents:
            node = node[parent]
        if value is None:
            node.pop(key)
        else:
            node[key] = value
    return schema


@pytest.mark.parametrize("changes, difference", [
    ({"parameters__properties__expression__type": "integer"},
     'function.parameters.properties.expression.type is "integer" in the data, "string" in the toolbox'),
    ({"parameters__required": []}, 'function.parameters.required is [] in the data, ["expression"] in the toolbox'),
    ({"parameters__properties__precision": {"type": "integer"}},
     'function.parameters.properties.precision is {"type": "integer"} in the data, absent in the toolbox'),
    ({"parameters": None}, "function.parameters.properties.expression is absent in the data"),
    ({"parameters__properties__expression__enum": ["1+1"]}, "function.parameters.properties.expression.enum is"),
    ({"strict": True}, "function.strict is true in the data, absent in the toolbox"),
], ids=["a type", "required", "an extra argument", "no parameters", "an enum", "another key"])
def test_a_row_offering_a_tool_with_another_schema_is_refused_naming_the_rows_and_the_difference(
        tmp_path, changes, difference):
    from datasets import Dataset

    from minimind_trl.agent.mock_tools import SCHEMAS
    from minimind_trl.agent.recipe import check_offered_tools
    from minimind_trl.agent.tools import load_toolbox

    rows = [[SCHEMAS["calculate_math"]], [calculate_math_schema(**changes)], [calculate_math_schema(**changes)]]
    dataset = Dataset.from_dict({"tools": [json.dumps(tools) for tools in rows]})
    toolbox = load_toolbox(["calculate_math"], timeout=None)
    with pytest.raises(RecipeError) as refused:
        check_offered_tools(dataset, toolbox, "agent.jsonl")
    message = str(refused.value)
    assert message.startswith("agent.jsonl: its rows offer tools of agent_tools with schemas other than the tools' own:"
                              " 'calculate_math' (rows 1, 2 of 3: ")
    assert difference in message


def test_description_texts_may_differ_but_a_property_named_description_may_not():
    from minimind_trl.agent.mock_tools import SCHEMAS
    from minimind_trl.agent.tools import schema_difference

    own = SCHEMAS["calculate_math"]
    reworded = calculate_math_schema(description="Evaluate an arithmetic expression",
                                     parameters__properties__expression__description="what to evaluate")
    assert schema_difference(reworded, own) is None
    required_reordered = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["b", "a"]}}}
    required_in_order = json.loads(json.dumps(required_reordered).replace('["b", "a"]', '["a", "b"]'))
    assert schema_difference(required_reordered, required_in_order) is None
    named = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"description": {"type": "string"}}, "required": ["description"]}}}
    renamed = json.loads(json.dumps(named).replace('"description": {"type": "string"}', '"text": {"type": "string"}'))
    assert "properties.description is" in schema_difference(named, renamed)
    no_arguments = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
    assert schema_difference({"type": "function", "function": {"name": "now"}}, no_arguments) is None
