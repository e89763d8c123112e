"""MiniMind-3's agent RL stage (upstream d65ef2c `trainer/train_agent.py`): multi-turn tool calling on TRL.

* `data`: upstream's `agent_rl.jsonl` rows as a TRL dataset (`prompt`, `tools`, `gt`) and the helpers that give back
  upstream's Python values;
* `parsing`: `<tool_call>` blocks and a turn's thought and answer, read as upstream reads them;
* `tools`, `mock_tools`, `safe_math`, `tool_process`: upstream's six mock tools (without `eval`), a user's own
  tools, and a `Toolbox` that runs calls in a worker process killed at the time limit; what a tool does never stops
  the run, a fault of that harness (`ToolHarnessError`) does;
* `reward`: upstream's agent reward as one TRL reward function, every term logged;
* `rollout`: upstream's multi-turn tool loop as TRL's `rollout_func` (`AgentRollout`);
* `recipe`: a recipe's `rollout: agent`, checked and built for `minimind-trl grpo`.

This package sits beside `trainer/` and above `rewards/`, whose reward-model pieces it reuses.
"""

from .data import (
    decode_gt,
    decode_tools,
    load_agent_dataset,
    prompt_messages,
    prompt_tools,
    sample_gt,
    sample_tools,
    tool_names,
)
from .parsing import answer_tool_calls, parse_tool_calls, read_call, split_turn, tool_call_values, turn_answer
from .reward import TERMS, AgentReward, transcript_terms, verified_gt
from .rollout import AgentRollout, observation_ids, pack_rollout
from .tool_process import ToolHarnessError
from .tools import (
    OBSERVATION_LIMIT,
    TOOL_NOT_FOUND,
    UPSTREAM_TOOL_NAMES,
    Tool,
    Toolbox,
    ToolOutcome,
    load_toolbox,
    observation_text,
    tool_from_function,
)

__all__ = [
    "OBSERVATION_LIMIT",
    "TERMS",
    "TOOL_NOT_FOUND",
    "UPSTREAM_TOOL_NAMES",
    "AgentReward",
    "AgentRollout",
    "Tool",
    "ToolHarnessError",
    "ToolOutcome",
    "Toolbox",
    "answer_tool_calls",
    "decode_gt",
    "decode_tools",
    "load_agent_dataset",
    "load_toolbox",
    "observation_ids",
    "observation_text",
    "pack_rollout",
    "parse_tool_calls",
    "prompt_messages",
    "prompt_tools",
    "read_call",
    "sample_gt",
    "sample_tools",
    "split_turn",
    "tool_call_values",
    "tool_from_function",
    "tool_names",
    "transcript_terms",
    "turn_answer",
    "verified_gt",
]
