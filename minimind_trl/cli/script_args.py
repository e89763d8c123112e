"""Script arguments of `minimind-trl grpo`: what to train on and with which rewards.

The training hyper-parameters live in `MiniMindGRPOConfig` (TRL's `GRPOConfig` with upstream's defaults)
and the policy/LoRA options in TRL's `ModelConfig`; this dataclass holds the rest of a recipe: the data,
the reward functions and the hand-off options. Recipes set these fields by name in their YAML.
"""

from dataclasses import dataclass, field

from trl import DatasetMixtureConfig, ScriptArguments
from trl.scripts.utils import DatasetConfig

from ..data import ROLE_MODES
from ..agent import reward as agent_reward  # noqa: F401  (registers agent_reward and agent_rule_reward in REWARDS)
from ..rewards.registry import REWARD_MODEL_TYPES, REWARDS
from ..trainer.checks.config_ranges import check_ranges

ROLLOUTS = ("single_turn", "agent")
_AGENT_FIELDS = {"agent_tools": None, "agent_tool_timeout": 1.0, "agent_max_turns": 3, "agent_max_total_length": 2500,
                 "agent_max_tool_output": 8192}


@dataclass
class GRPOScriptArguments(ScriptArguments, DatasetMixtureConfig):
    r"""
    Arguments of `minimind-trl grpo` besides `MiniMindGRPOConfig` and `ModelConfig`: TRL's script arguments and
    dataset mixture (`datasets`, `test_split_size`; `minimind_trl.cli.run_data` reads them), and ours.

    Parameters:
        dataset_name (`str`):
            RLAIF data: a local `.jsonl` file in MiniMind's format (`{"conversations": [...]}`), a folder of them,
            or a Hub dataset name. Upstream: `--data_path`.
        dataset_data_files (`str`, *optional*):
            Which file(s) of a folder or Hub dataset to read, e.g. `rlaif-mini.jsonl` of
            `jingyaogong/minimind_dataset`.
        dataset_max_samples (`int`, *optional*):
            Keep only the first N rows of the training prompts, and of the held-out ones (smoke tests, the demo).
            `None` keeps everything.
        eval_dataset_name (`str`, *optional*):
            Held-out prompts in a source of their own, in `dataset_name`'s format: a `.jsonl` file (read whole), a
            folder or a Hub dataset (its `dataset_test_split` split). Evaluated on with `eval_strategy` other than
            `no`; unset, the held-out prompts are the `dataset_test_split` split of `dataset_name` (TRL's rule).
        reward_funcs (`list[str]`):
            Reward functions, summed with `reward_weights` (a `MiniMindGRPOConfig` field, default all 1). Names:
            `format` (+0.5 for upstream's `<think>…</think><answer>…</answer>` layout), `tag_count` (+0.25 per tag
            that occurs exactly once), `reward_model` (the reward model at `reward_model_name_or_path`, scored the
            upstream's way), or any importable `package.module:function` (also `package.module.function`) taking TRL's
            reward-function arguments. Seed `--reasoning 1`: `[format, tag_count, reward_model]`; `--reasoning 0`:
            `[reward_model]`. MiniMind-3 (d65ef2c): `[length, thinking_length, think_close_count, repetition_penalty,
            answer_reward_model]` (docs/minimind3-rewards.md).
        reward_model_name_or_path (`str`, *optional*):
            Folder or Hub id of the reward model used by `reward_model` or `answer_reward_model`. Upstream:
            `--reward_model_path` (`internlm2-1_8b-reward`).
        reward_model_type (`str`, defaults to `"auto"`):
            `internlm2` (InternLM2's reward head, loaded natively, no remote code), `sequence_classification`
            (any `AutoModelForSequenceClassification` with one label) or `auto` (decided from `config.json`).
        reasoning (`bool`, defaults to `True`):
            Seed `--reasoning`: the reward-model term also scores the text inside `<answer>…</answer>` and blends
            `0.4 * full + 0.6 * answer`. It does not add rule rewards by itself; list them in `reward_funcs`.
        reward_model_clip (`float`, defaults to `3.0`):
            Reward-model scores are clipped to `[-clip, clip]` (upstream's `scale = 3.0`; MiniMind-3 clips to 3 too).
        dataset_roles (`str`, defaults to `"position"`):
            How turns get their roles: `position` (MiniMind2's RLAIFDataset: user, assistant, user, ...) or `data`
            (each turn's `role` field, as MiniMind-3's data carries them, system turns included).
        thinking_ratio (`float`, *optional*):
            MiniMind-3 `--thinking_ratio` (upstream default 0.9): each prompt is rendered with the chat template's
            `open_thinking=True` with this probability, else with `open_thinking=False` (the closed empty thought).
            The choice is keyed on (`seed`, epoch, row), so a resumed run renders every prompt as the uninterrupted
            one; the prompts then reach TRL and the reward functions as rendered text. Needs a template that reads
            `open_thinking` (MiniMind-3's). `None` (default, MiniMind2): no choice, TRL renders the messages.
        system_prompt_ratio (`float`, defaults to `0.0`):
            MiniMind-3's `pre_processing_chat`: the share (upstream 0.2) of prompts without a system turn that get
            one of its ten system prompts, chosen per prompt like `thinking_ratio`. 0 (default, MiniMind2): none.
        tokenizer_name_or_path (`str`, *optional*):
            Tokenizer folder or Hub id. Required when `model_name_or_path` is a native MiniMind `.pth`, which
            carries no tokenizer; defaults to the model folder otherwise.
        native_num_attention_heads (`int`, *optional*):
            Query heads of a native `.pth` policy (not visible in its tensor shapes; MiniMind's default 8 when
            unset), as `minimind-trl convert --num_attention_heads`.
        native_config (`dict` or `str`, *optional*):
            Settings of a native `.pth` policy that its tensors cannot show, as upstream `MiniMindConfig` keywords
            (the keys of `minimind-trl convert --set`), e.g. `{num_experts_per_tok: 2, inference_rope_scaling: true}`
            for a MoE trained top-2 and run with YaRN. Wins over the `<stem>.config.json` sidecar. A JSON string on
            the command line.
        callbacks (`list[str]`, *optional*):
            Extra `transformers.TrainerCallback` classes as `package.module:ClassName`, built without arguments.
        rollout (`str`, defaults to `"single_turn"`):
            `single_turn`: one completion per prompt (both generations' `train_grpo.py`). `agent`: MiniMind-3's agent
            RL (`train_agent.py`): `dataset_name` holds `agent_rl.jsonl` rows (`conversations` with the system turn's
            `tools`, `gt`), and each rollout is up to `agent_max_turns` generations of `max_completion_length` new
            tokens each, its `<tool_call>`s run against `agent_tools` in between (docs/agent.md). `thinking_ratio` is
            then drawn per rollout, as upstream draws it.
        agent_tools (`list[str]`, *optional*):
            The tools agent rollouts run calls against: upstream's mock tool names (`calculate_math`,
            `unit_converter`, `get_current_weather`, `get_current_time`, `get_exchange_rate`, `translate_text`) or
            `package.module:function` (typed, with a docstring, as TRL's `tools=`). Unset: upstream's six. Each
            sample's prompt shows its own schemas (its system turn's `tools`).
        agent_tool_timeout (`float`, defaults to `1.0`):
            Seconds one tool call may take before it gets an error observation (upstream's 1 s `SIGALRM`).
        agent_max_turns (`int`, defaults to `3`):
            Turns (model replies) per agent rollout (upstream's hard-coded `max_turns=3`); calls in the last one still run,
            and the rollout counts as unfinished.
        agent_max_total_length (`int`, *optional*, defaults to `2500`):
            The agent rollout's training sequence, prompt included, keeps its last this many tokens (upstream
            `--max_total_len`). `None`: no cut.
        agent_max_tool_output (`int`, *optional*, defaults to `8192`):
            Characters one turn's tool messages may hold together (each is also cut to 2048, upstream's cut); the
            later calls' messages are cut to fit, with a warning once. `None`: no cap (upstream).
    """

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": f"Reward functions: {', '.join(REWARDS)} or an importable 'package.module:function'. "
            "Weighted by `reward_weights`."
        },
    )
    reward_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Reward model folder or Hub id for the `reward_model` or `answer_reward_model` reward."},
    )
    reward_model_type: str = field(
        default="auto",
        metadata={"help": "How to load the reward model.", "choices": list(REWARD_MODEL_TYPES)},
    )
    reasoning: bool = field(
        default=True,
        metadata={
            "help": "Seed --reasoning: blend the reward model's score of the <answer> text (0.4 full + 0.6 answer)."
        },
    )
    reward_model_clip: float = field(default=3.0, metadata={"help": "Clip reward-model scores to [-clip, clip]."})
    dataset_roles: str = field(
        default="position",
        metadata={
            "help": "Turn roles: by position (MiniMind2) or from each turn's role field.",
            "choices": list(ROLE_MODES),
        },
    )
    thinking_ratio: float | None = field(
        default=None,
        metadata={
            "help": "MiniMind-3 --thinking_ratio: probability of rendering a prompt with open_thinking=True (0..1); "
            "None: TRL renders the messages."
        },
    )
    system_prompt_ratio: float = field(
        default=0.0,
        metadata={"help": "MiniMind-3: share of prompts without a system turn given a random system prompt (0..1)."},
    )
    dataset_data_files: str | None = field(
        default=None, metadata={"help": "File(s) of a folder or Hub dataset to read (e.g. rlaif-mini.jsonl)."}
    )
    dataset_max_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N rows of the training (and held-out) prompts."}
    )
    eval_dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Held-out prompts in a source of their own (a .jsonl file, a folder, a Hub dataset), evaluated on "
            "with eval_strategy; unset: the dataset_test_split split of dataset_name."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id (required for a native .pth policy)."}
    )
    native_num_attention_heads: int | None = field(
        default=None, metadata={"help": "Query heads of a native .pth policy (MiniMind's default 8 when unset)."}
    )
    native_config: dict | str | None = field(
        default=None,
        metadata={
            "help": "Settings of a native .pth policy its tensors cannot show (convert --set keys), e.g. "
            "'{\"num_experts_per_tok\": 2, \"inference_rope_scaling\": true}'."
        },
    )
    callbacks: list[str] | None = field(
        default=None, metadata={"help": "Extra TrainerCallback classes as 'package.module:ClassName'."}
    )
    rollout: str = field(
        default="single_turn",
        metadata={
            "help": "single_turn (train_grpo.py) or agent (train_agent.py: multi-turn tool calls on agent_rl rows).",
            "choices": list(ROLLOUTS),
        },
    )
    agent_tools: list[str] | None = field(
        default=None,
        metadata={"help": "Tools of agent rollouts: upstream mock names or 'package.module:function' (unset: the six)."},
    )
    agent_tool_timeout: float = field(default=1.0, metadata={"help": "Seconds a tool call may take (upstream 1)."})
    agent_max_turns: int = field(default=3, metadata={"help": "Turns (model replies) per agent rollout (upstream 3)."})
    agent_max_total_length: int | None = field(
        default=2500, metadata={"help": "Tokens an agent rollout keeps for training, from the end (upstream 2500)."}
    )
    agent_max_tool_output: int | None = field(
        default=8192, metadata={"help": "Characters of one turn's tool messages together (upstream: no cap)."}
    )

    def __post_init__(self):
        _check_mixture_entries(self.datasets)
        DatasetMixtureConfig.__post_init__(self)  # the recipe's `datasets:` mappings as TRL's `DatasetConfig`s
        if self.reward_model_type not in REWARD_MODEL_TYPES:
            raise ValueError(f"reward_model_type must be one of {REWARD_MODEL_TYPES}, got {self.reward_model_type!r}")
        if self.dataset_roles not in ROLE_MODES:
            raise ValueError(f"dataset_roles must be one of {ROLE_MODES}, got {self.dataset_roles!r}")
        check_ranges(self)  # reward_model_clip, the ratios, dataset_max_samples, ... (trainer/checks/config_ranges.py)
        if self.native_config is not None:
            self.native_config = _check_native_config(self.native_config)
        _check_rollout_settings(self)


def _check_rollout_settings(args) -> None:
    """`rollout` and the agent settings together, refused naming the key: agent settings count only with
    `rollout: agent`."""
    if args.rollout not in ROLLOUTS:
        raise ValueError(f"rollout must be one of {ROLLOUTS}, got {args.rollout!r}")
    if args.rollout != "agent":
        changed = [name for name, default in _AGENT_FIELDS.items() if getattr(args, name) != default]
        if changed:
            raise ValueError(f"{', '.join(changed)} only apply with rollout: agent (rollout is {args.rollout!r})")
        return
    if args.system_prompt_ratio:  # the agent settings' ranges are checked with every other (config_ranges.py)
        raise ValueError(
            f"system_prompt_ratio={args.system_prompt_ratio}: upstream's agent data keeps its own system turn (the "
            "one carrying the tools); set it to 0 with rollout: agent"
        )


_MIXTURE_KEYS = tuple(DatasetConfig.__dataclass_fields__)


def _check_mixture_entries(entries) -> None:
    """Each `datasets:` entry a mapping of `DatasetConfig`'s keys with a `path` (TRL's would fail with a raw
    TypeError), or a ValueError naming the entry and the key."""
    for index, entry in enumerate(entries or []):
        if isinstance(entry, DatasetConfig):
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"datasets[{index}]: expected a mapping with a path (keys {', '.join(_MIXTURE_KEYS)}), "
                             f"got {entry!r}")
        unknown = sorted(set(entry) - set(_MIXTURE_KEYS))
        if unknown:
            raise ValueError(f"datasets[{index}]: unknown key(s) {', '.join(unknown)}; a mixture entry takes "
                             f"{', '.join(_MIXTURE_KEYS)}")
        if not entry.get("path"):
            raise ValueError(f"datasets[{index}]: needs a path (an RLAIF .jsonl file, a folder or a Hub dataset)")


def _check_native_config(value) -> dict:
    """A dict of upstream `MiniMindConfig` keywords (checked now, before anything loads), or a ValueError naming the key."""
    import json

    from ..formats.native_config import ALLOWED_CONFIG_KEYS, check_option_value

    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"native_config: expected a JSON object of MiniMindConfig keywords, got {value!r}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"native_config: expected a mapping of MiniMindConfig keywords, got {value!r}")
    unknown = sorted(set(value) - ALLOWED_CONFIG_KEYS)
    if unknown:
        raise ValueError(f"native_config: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(sorted(ALLOWED_CONFIG_KEYS))}")
    for key, item in value.items():
        try:
            check_option_value(key, item)
        except ValueError as exc:
            raise ValueError(f"native_config: {exc}") from exc
    return dict(value)


__all__ = ["GRPOScriptArguments"]
