"""The upstream agent fixtures (`fixtures/minimind3-agent/`), read case by case: whatever the files hold."""

import json
from collections import defaultdict

from conftest import SHARED, require_shared

AGENT_FIXTURES = SHARED / "fixtures" / "minimind3-agent"
TOOLS_FILE = AGENT_FIXTURES / "tools.jsonl"
REWARDS_FILE = AGENT_FIXTURES / "rewards.jsonl"
MINIMIND3_TOKENIZER = SHARED / "fixtures" / "minimind-upstream" / "MiniMind-3" / "tokenizer"


def read_cases(path) -> list[dict]:
    lines = require_shared(path).read_text(encoding="utf-8").splitlines()
    cases = [json.loads(line) for line in lines if line.strip()]
    assert cases, f"{path} holds no cases"
    return cases


def tool_cases(kind: str) -> list[dict]:
    """Every case of one `kind` in tools.jsonl (at least one: a kind the file lost would otherwise pass)."""
    cases = [case for case in read_cases(TOOLS_FILE) if case["kind"] == kind]
    assert cases, f"{TOOLS_FILE} has no {kind!r} case"
    return cases


def reward_groups(cases: list[dict]) -> list[list[dict]]:
    """rewards.jsonl's completions grouped by prompt (`group`), as TRL scores a generation group together."""
    groups = defaultdict(list)
    for case in cases:
        groups[case["group"]].append(case)
    return [groups[key] for key in sorted(groups)]
