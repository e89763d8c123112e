"""A recipe's `rollout: agent`: what `minimind-trl grpo` checks before loading anything, and the rollout it builds.

The settings themselves (`agent_tools`, `agent_tool_timeout`, `agent_max_turns`, `agent_max_total_length`,
`thinking_ratio`) are the command's script arguments (`minimind_trl.cli.script_args`); each is checked there on its
own. Here: the combinations with the trainer's settings, and the tokenizer's template.
"""

import logging

from ..errors import AgentDataError, RecipeError
from ..prompt_rendering import OPEN_THINKING_KWARG
from .data import check_tools, decode_tools
from .rollout import DEFAULT_MAX_TOOL_OUTPUT, AgentRollout, observation_ids, render_text
from .tools import recipe_toolbox, schema_difference

logger = logging.getLogger(__name__)


def check_agent_recipe(script_args, training_args) -> None:
    """Refuse, naming the key, what an agent run could not honour; warn about what it ignores."""
    recipe_toolbox(script_args)  # every tool name a mock or an importable function
    if training_args.remove_unused_columns:
        raise RecipeError(
            "rollout: agent scores each rollout with its row's `tools` and `gt`, which remove_unused_columns=true "
            "would drop; set remove_unused_columns: false (TRL's GRPO default)"
        )
    kwargs = training_args.chat_template_kwargs or {}
    if script_args.thinking_ratio is not None and OPEN_THINKING_KWARG in kwargs:
        raise RecipeError(
            f"thinking_ratio={script_args.thinking_ratio} draws open_thinking per rollout, but chat_template_kwargs "
            f"also sets open_thinking={kwargs[OPEN_THINKING_KWARG]!r}; drop one of them"
        )
    if training_args.use_transformers_continuous_batching:
        raise RecipeError(
            "rollout: agent generates each turn through TRL's generation step for token ids; "
            "use_transformers_continuous_batching is not supported with it (set it to false)"
        )
    if training_args.max_prompt_length is not None:
        logger.warning(
            "rollout: agent does not cut prompts at max_prompt_length=%s (upstream's agent loop does not); the whole "
            "rollout is cut from the left at agent_max_total_length=%s",
            training_args.max_prompt_length, script_args.agent_max_total_length,
        )


_PROBE_TOOL = {"type": "function", "function": {"name": "agent_probe_tool", "description": "probe",
                                                 "parameters": {"type": "object", "properties": {}}}}
_PROBE_RESULT = "agent probe result"


def check_agent_tokenizer(tokenizer, thinking_ratio: float | None = None, template_kwargs=None) -> None:
    """Refuse a chat template the agent rollout cannot run on: it must show each sample's tool schemas in the prompt
    and write tool results after the assistant's EOS (MiniMind2's fea69cf template and MiniMind-3's both do), and,
    when `thinking_ratio` opens thoughts, honour `open_thinking` (MiniMind-3's only)."""
    from jinja2 import TemplateError

    kwargs = dict(template_kwargs or {})
    user = [{"role": "user", "content": "x"}]
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        raise RecipeError("rollout: agent renders prompts with the chat template, but this tokenizer has none: use a "
                          "MiniMind-3 tokenizer (tokenizer_name_or_path)")
    try:
        prompt = render_text(tokenizer, user, tools=[_PROBE_TOOL], template_kwargs=kwargs)
        observation = tokenizer.decode(observation_ids(tokenizer, [_PROBE_RESULT], template_kwargs=kwargs,
                                                       generation_prompt=True))
    except (TemplateError, TypeError, ValueError) as error:
        raise RecipeError(f"rollout: agent cannot render tool turns with this tokenizer's chat template ({error}): "
                          "use a MiniMind-3 tokenizer (tokenizer_name_or_path)") from None
    if _PROBE_TOOL["function"]["name"] not in prompt:
        raise RecipeError("rollout: agent renders each sample's tool schemas into its prompt, but this tokenizer's "
                          "chat template does not read `tools`: use a MiniMind-3 tokenizer (tokenizer_name_or_path)")
    if _PROBE_RESULT not in observation:
        raise RecipeError("rollout: agent appends tool results as `tool` messages, but this tokenizer's chat template "
                          "does not render them: use a MiniMind-3 tokenizer (tokenizer_name_or_path)")
    if thinking_ratio:
        opened, closed = (render_text(tokenizer, user, tools=None, template_kwargs={**kwargs, OPEN_THINKING_KWARG: v})
                          for v in (True, False))
        if opened == closed:
            raise RecipeError(
                f"thinking_ratio={thinking_ratio} opens a thought in some rollouts (open_thinking=true), but this "
                "tokenizer's chat template ignores open_thinking (MiniMind-3's reads it): set thinking_ratio: 0 or "
                "use a MiniMind-3 tokenizer (tokenizer_name_or_path)"
            )


def check_offered_tools(dataset, toolbox, source) -> None:
    """Refuse data whose rows offer tools the toolbox lacks, or offer a tool of the toolbox with a schema other than
    the tool's own (`tools.schema_difference`): every call of a missing tool would get "tool not found" and be scored
    invalid, and a differing schema shows the model arguments the tool does not take. Names the tools and the rows
    (0-based, in the order the data loaded)."""
    missing: dict[str, list[int]] = {}
    differing: dict[str, tuple[str, list[int]]] = {}
    for index, tools in enumerate(dataset["tools"]):
        for schema in _row_tools(tools, f"{source}: row {index}"):
            name = schema["function"]["name"]
            own = toolbox.get(name)
            difference = None if own is None else schema_difference(schema, own.schema)
            if own is None:
                missing.setdefault(name, []).append(index)
            elif difference:
                differing.setdefault(name, (difference, []))[1].append(index)
    if missing:
        listed = "; ".join(f"{name!r} ({_rows(rows, len(dataset))})" for name, rows in missing.items())
        raise RecipeError(
            f"{source}: its rows' tool schemas offer tools agent_tools does not run: {listed}. Every call of them "
            f"would get {{\"error\": \"tool not found\"}} and count as invalid. Add them to agent_tools (a mock's name or "
            f"'package.module:function'; agent_tools now: {', '.join(toolbox.names)}) or drop them from the data"
        )
    if differing:
        listed = "; ".join(f"{name!r} ({_rows(rows, len(dataset))}: {difference})"
                           for name, (difference, rows) in differing.items())
        raise RecipeError(
            f"{source}: its rows offer tools of agent_tools with schemas other than the tools' own: {listed}. The "
            "model would be shown arguments the tool does not take. Write each row's schema as the tool's own "
            "(`transformers.utils.get_json_schema(function)` for a function; `minimind_trl.agent.mock_tools.SCHEMAS` "
            "for a mock); description texts may differ"
        )


def _row_tools(tools, where: str) -> list[dict]:
    """A row's `tools` value decoded and checked (a dataset built by hand skipped the loader's checks)."""
    try:
        decoded = decode_tools(tools)
    except (TypeError, ValueError) as error:
        raise AgentDataError(f"{where}: tools is not JSON text of a list ({error})") from None
    return [] if decoded is None else check_tools(decoded, where)


def _rows(rows: list[int], total: int) -> str:
    noun = "row" if len(rows) == 1 else "rows"
    return f"{noun} {', '.join(map(str, rows[:5]))}{', ...' if len(rows) > 5 else ''} of {total}"


def build_agent_rollout(script_args) -> AgentRollout:
    """The recipe's `AgentRollout`: its tools, turns, length cap and per-rollout thinking draw."""
    return AgentRollout(
        recipe_toolbox(script_args),
        max_turns=script_args.agent_max_turns,
        max_total_length=script_args.agent_max_total_length,
        thinking_ratio=script_args.thinking_ratio,
        max_tool_output=getattr(script_args, "agent_max_tool_output", DEFAULT_MAX_TOOL_OUTPUT),
    )


__all__ = ["build_agent_rollout", "check_agent_recipe", "check_agent_tokenizer", "check_offered_tools"]
