"""The upstream MiniMind generations this package follows, one record each, and what is derived from them.

`GENERATIONS["minimind2"]` is the seed (fea69cf), whose defaults `MiniMindGRPOConfig` keeps;
`GENERATIONS["minimind3"]` is upstream's HEAD (d65ef2c), whose `trainer/train_grpo.py` trains a different GRPO.
`TRL_DEFAULTS` (`upstream: trl`) is not a MiniMind generation but TRL's own `GRPOConfig`: the defaults
`MiniMindGRPOConfig.trl_defaults()` takes, so a TRL user can swap `GRPOTrainer` for `MiniMindGRPOTrainer` and keep
TRL's algorithm (docs/parity.md#as-a-grpotrainer).
A record holds the reward set (names in `minimind_trl.rewards.registry.REWARDS`), the advantage estimator, the
policy loss and its aggregation (names in `minimind_trl.trainer`'s registries) and every other default, each
with the upstream flag it stands for. From the records come the model card's parity table (`compare`), the
check of a recipe that declares `upstream: <generation>` (`deviations`), the side-by-side table in
`docs/generations.md` and in `MiniMindGRPOConfig`'s documentation (`render_generations_table`).

This module holds data only (no torch, no TRL), so the config can import it.
"""

import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

TRAINING = "training"  # a `MiniMindGRPOConfig` field
SCRIPT = "script"  # a field of the command's script arguments (rewards, data), not of the config
DERIVED = "derived"  # what the run does, computed from several config fields (the config's `setting_value`)


@dataclass(frozen=True)
class UpstreamSetting:
    """One upstream default in this package's terms: the field `name` set to `value`; `flag` is the upstream
    flag (or the code) it stands for."""

    name: str
    value: Any
    flag: str
    kind: str = TRAINING


@dataclass(frozen=True)
class Generation:
    """One upstream generation's GRPO: its algorithm, its defaults, and what has no setting here (`notes`)."""

    name: str
    label: str
    commit: str
    reward_funcs: UpstreamSetting | None  # None: no reward set of its own (TRL)
    advantage_estimator: UpstreamSetting
    loss_type: UpstreamSetting
    loss_aggregation: UpstreamSetting
    settings: tuple[UpstreamSetting, ...]
    notes: tuple[str, ...] = ()
    source: str = "MiniMind's `train_grpo.py`"  # what a run is compared against, in the model card's words
    architecture: str | None = None  # the MiniMind architecture whose output its rewards score; None: either
    recipe: str | None = None  # the shipped recipe that reproduces it
    writes: str = ""  # what its models write, which its rewards score

    @property
    def title(self) -> str:
        return f"{self.label} ({self.commit})"

    def rows(self) -> tuple[UpstreamSetting, ...]:
        """The algorithm first (rewards, advantages, loss, aggregation), then every other default."""
        algorithm = (self.reward_funcs, self.advantage_estimator, self.loss_type, self.loss_aggregation)
        return (*(row for row in algorithm if row is not None), *self.settings)

    def setting(self, name: str) -> UpstreamSetting | None:
        return next((row for row in self.rows() if row.name == name), None)


@dataclass(frozen=True)
class RunPrecision:
    """The precision a run trains in, on the device it runs on; `chosen_for_cpu`: `bf16` was left unset and the
    CPU's own choice made it (`trainer.speed.cpu_precision`), as a device's kind makes it for upstream's loop."""

    dtype: str  # "bf16", "fp16" or "fp32"
    on_cpu: bool
    chosen_for_cpu: bool = False

    def __str__(self) -> str:
        chosen = ", chosen for this CPU" if self.chosen_for_cpu else ""
        return f"{self.dtype} on {'CPU' if self.on_cpu else 'GPU'}{chosen}"


@dataclass(frozen=True)
class DevicePrecision:
    """Upstream's `--dtype bfloat16`: its loop enters bf16 autocast only on CUDA and trains in fp32 on a CPU, so
    what it does depends on the device. A run matches it when it trains as upstream's loop would on the same device,
    or when `bf16` was left unset and the CPU chose (bf16 where it is native and faster, fp32 elsewhere: a choice of
    the hardware, as upstream's is, not of the recipe). An explicit `bf16: true` on CPU or `false` on GPU departs."""

    def matches(self, run) -> bool:
        if isinstance(run, RunPrecision):
            return run.chosen_for_cpu or run.dtype == ("fp32" if run.on_cpu else "bf16")
        return run is True  # a bare `bf16` field, device unknown: read as upstream's CUDA run

    def __str__(self) -> str:
        return "bf16 on GPU, fp32 on CPU"


UPSTREAM_PRECISION = DevicePrecision()


def _shared(generations: int, **values) -> tuple[UpstreamSetting, ...]:
    """The settings whose flags both generations name alike (values differ)."""
    return (
        UpstreamSetting("learning_rate", values["learning_rate"], "--learning_rate"),
        UpstreamSetting("lr_scheduler_type", "cosine_with_min_lr", "CosineAnnealingLR(eta_min=lr/10)"),
        UpstreamSetting("max_grad_norm", 1.0, "--grad_clip"),
        UpstreamSetting("weight_decay", 0.01, "AdamW default"),
        UpstreamSetting("num_train_epochs", 1.0, "--epochs"),
        UpstreamSetting("per_device_train_batch_size", 2 * generations, f"--batch_size 2 x --num_generations {generations}"),
        UpstreamSetting("gradient_accumulation_steps", 1, "--accumulation_steps"),
        UpstreamSetting("num_generations", generations, "--num_generations"),
        UpstreamSetting("max_prompt_length", values["max_prompt_length"], "--max_seq_len"),
        UpstreamSetting("max_completion_length", values["max_completion_length"], "--max_gen_len"),
        UpstreamSetting("temperature", 0.8, values["temperature_flag"]),
        UpstreamSetting("top_k", 50, values["sampler"]),
        UpstreamSetting("top_p", values["top_p"], values["sampler"]),
        UpstreamSetting("beta", values["beta"], "--beta"),
        *values.get("clipping", ()),
        UpstreamSetting("tempered_logprobs", False, "log-probs of untempered logits"),
        UpstreamSetting("num_iterations", 1, "one update per generation"),
        UpstreamSetting("use_bias_correction_kl", False, "plain k3 KL"),
        UpstreamSetting("bf16", UPSTREAM_PRECISION, "--dtype bfloat16; autocast on CUDA only", DERIVED),
        UpstreamSetting("seed", 42, "setup_seed(42)"),
        UpstreamSetting("logging_steps", 1, "--log_interval"),
        UpstreamSetting("save_steps", 10, "--save_interval"),
    )


MINIMIND2 = Generation(
    name="minimind2",
    label="MiniMind2",
    commit="fea69cf",
    reward_funcs=UpstreamSetting(
        "reward_funcs", ("format", "tag_count", "reward_model"), "--reasoning 1, calculate_rewards", SCRIPT
    ),
    advantage_estimator=UpstreamSetting("advantage_estimator", "minimind", "group z-score, clamp, batch z-score"),
    loss_type=UpstreamSetting("loss_type", "grpo", "k3 KL + advantage x ratio, ratio 1"),
    loss_aggregation=UpstreamSetting(
        "loss_aggregation", "seq-mean-token-mean", "masked token mean per completion", DERIVED
    ),
    settings=(
        *_shared(
            8,
            learning_rate=8e-8,
            max_prompt_length=66,
            max_completion_length=1536,
            temperature_flag="generate(temperature=0.8)",
            sampler="transformers 4.x generate default",
            top_p=1.0,
            beta=0.02,
        ),
        UpstreamSetting("dataset_roles", "position", "RLAIFDataset: user, assistant, ... by position", SCRIPT),
        UpstreamSetting("reasoning", True, "--reasoning", SCRIPT),
        UpstreamSetting("reward_model_clip", 3.0, "scale = 3.0", SCRIPT),
    ),
    architecture="minimind2",
    recipe="recipes/minimind2/grpo/reasoning.yaml",
    writes="`<think>...</think><answer>...</answer>`",
    notes=(
        "`--reasoning 0` (the chat model) scores with the reward model alone: `reward_funcs: [reward_model]`, "
        "`reasoning: false`.",
        "Old log-probs are the current ones (one pass per generation): the ratio is 1 and nothing is clipped.",
        "The reward model sees the rendered prompt's turns and the whole completion; reasoning: 0.4 x full + 0.6 x "
        "the `<answer>` text.",
    ),
)

MINIMIND3 = Generation(
    name="minimind3",
    label="MiniMind-3",
    commit="d65ef2c",
    reward_funcs=UpstreamSetting(
        "reward_funcs",
        ("length", "thinking_length", "think_close_count", "repetition_penalty", "answer_reward_model"),
        "calculate_rewards",
        SCRIPT,
    ),
    advantage_estimator=UpstreamSetting(
        "advantage_estimator", "group_zscore", "(r - mean) / (std(unbiased=False) + 1e-4), no clamp, no batch step"
    ),
    loss_type=UpstreamSetting("loss_type", "minimind3_cispo", "--loss_type cispo; grpo: minimind3_grpo"),
    loss_aggregation=UpstreamSetting(
        "loss_aggregation", "seq-mean-token-mean", "masked token mean per completion", DERIVED
    ),
    settings=(
        *_shared(
            6,
            learning_rate=3e-7,
            max_prompt_length=768,
            max_completion_length=1024,
            temperature_flag="rollout(temperature=0.8)",
            sampler="MiniMindForCausalLM.generate default",
            top_p=0.85,
            beta=0.1,
            clipping=(
                UpstreamSetting("epsilon", 0.2, "--epsilon"),
                UpstreamSetting("epsilon_high", 5.0, "--epsilon_high"),
            ),
        ),
        UpstreamSetting("dataset_roles", "data", "RLAIFDataset: each turn's own role", SCRIPT),
        UpstreamSetting("thinking_ratio", 0.9, "--thinking_ratio", SCRIPT),
        UpstreamSetting("system_prompt_ratio", 0.2, "pre_processing_chat: 20 % get a system prompt", SCRIPT),
        UpstreamSetting("reward_model_clip", 3.0, "get_score: clip to [-3, 3]", SCRIPT),
    ),
    architecture="minimind3",
    recipe="recipes/minimind3/grpo/reasoning.yaml",
    writes="`<think>...</think>` and then the answer, without an `<answer>` block",
    notes=(
        "Old log-probs come from the rollout engine: the default `--rollout_engine torch` scores with the policy "
        "itself before the update (ratio 1, the clips never bind); `sglang` takes the server's log-probs, whose "
        "weights are refreshed every `--save_interval` steps.",
        "The completion mask ends at the first EOS inside the rollout's own mask (the last position without one).",
        "`system_prompt_ratio`: the prompts without a system turn get one of 10 fixed system prompts.",
        "The reward model scores the answer after `</think>`, the history folded into one user turn; no blend.",
        "Upstream's other defaults: `--data_path ../dataset/rlaif.jsonl`, `--from_weight full_sft`, "
        "`--hidden_size 768`, `--num_hidden_layers 8`.",
    ),
)

MINIMIND3_AGENT = Generation(
    name="minimind3_agent",
    label="MiniMind-3 agent RL",
    commit="d65ef2c",
    reward_funcs=UpstreamSetting("reward_funcs", ("agent_reward",), "train_agent.py calculate_rewards", SCRIPT),
    advantage_estimator=UpstreamSetting(
        "advantage_estimator", "group_zscore", "(r - mean) / (std(unbiased=False) + 1e-4), no clamp, no batch step"
    ),
    loss_type=UpstreamSetting("loss_type", "minimind3_cispo", "--loss_type cispo; grpo: minimind3_grpo"),
    loss_aggregation=UpstreamSetting(
        "loss_aggregation", "seq-mean-token-mean-nonempty", "mean over the rollouts with a trained token"
    ),
    settings=(
        UpstreamSetting("rollout", "agent", "rollout_batch / rollout_single", SCRIPT),
        UpstreamSetting("agent_max_turns", 3, "max_turns=3", SCRIPT),
        UpstreamSetting("agent_max_total_length", 2500, "--max_total_len", SCRIPT),
        UpstreamSetting("agent_tools", None, "MOCK_RESULTS: the six mock tools", SCRIPT),
        UpstreamSetting("agent_tool_timeout", 1.0, "execute_tool: signal.alarm(1)", SCRIPT),
        *(
            row if row.name != "max_prompt_length" else UpstreamSetting(
                "max_prompt_length", None, "prompts not cut (--max_seq_len sizes the model only)"
            )
            for row in _shared(
                4,
                learning_rate=3e-7,
                max_prompt_length=None,
                max_completion_length=768,
                temperature_flag="rollout(temperature=0.8)",
                sampler="MiniMindForCausalLM.generate default",
                top_p=0.85,
                beta=0.1,
                clipping=(
                    UpstreamSetting("epsilon", 0.2, "--epsilon"),
                    UpstreamSetting("epsilon_high", 5.0, "--epsilon_high"),
                ),
            )
        ),
        UpstreamSetting("thinking_ratio", 0.1, "--thinking_ratio (drawn per rollout)", SCRIPT),
        UpstreamSetting("system_prompt_ratio", 0.0, "AgentRLDataset: no added system prompt", SCRIPT),
        UpstreamSetting("reward_model_clip", 3.0, "get_score: clip to [-3, 3]", SCRIPT),
    ),
    notes=(
        "`max_completion_length` is each turn's budget (`--max_gen_len`); a rollout is up to `agent_max_turns` "
        "turns, the tool observations between them, cut from the left at `agent_max_total_length`.",
        "Tool observations, template tokens and EOS are not trained (mask 0); every sampled token of every turn is.",
        "Old log-probs come from the rollout engine (the torch engine: the policy itself, ratio 1).",
        "The reward model scores the no-call answer with the `# Tools` prompt; calls are scored by their count gap, "
        "`gt` in the final answer and the unfinished penalty (docs/agent.md).",
        "Upstream's other defaults: `--data_path ../dataset/agent_rl.jsonl`, `--from_weight full_sft`.",
    ),
)

# TRL 1.16's `GRPOConfig` defaults wherever `MiniMindGRPOConfig`'s differ, and TRL's behaviour for the settings it
# has no field for (tests/test_generations.py checks every value against the installed TRL).
TRL_DEFAULTS = Generation(
    name="trl",
    label="TRL GRPOConfig",
    commit="trl 1.16",
    source="TRL's `GRPOConfig` defaults",
    reward_funcs=None,
    advantage_estimator=UpstreamSetting("advantage_estimator", "trl", "scale_rewards, multi_objective_aggregation"),
    loss_type=UpstreamSetting("loss_type", "dapo", "GRPOConfig.loss_type"),
    loss_aggregation=UpstreamSetting("loss_aggregation", "token-mean", "dapo: over the batch's tokens", DERIVED),
    settings=(
        UpstreamSetting("learning_rate", 1e-6, "GRPOConfig.learning_rate"),
        UpstreamSetting("lr_scheduler_type", "linear", "TrainingArguments.lr_scheduler_type"),
        UpstreamSetting("weight_decay", 0.0, "TrainingArguments.weight_decay"),
        UpstreamSetting("num_train_epochs", 3.0, "TrainingArguments.num_train_epochs"),
        UpstreamSetting("per_device_train_batch_size", 8, "GRPOConfig.per_device_train_batch_size"),
        UpstreamSetting("steps_per_generation", "gradient_accumulation_steps", "GRPOConfig: None", DERIVED),
        UpstreamSetting("max_prompt_length", None, "no prompt truncation in TRL 1.16"),
        UpstreamSetting("max_completion_length", 512, "GRPOConfig.max_completion_length"),
        UpstreamSetting("temperature", 1.0, "GRPOConfig.temperature"),
        UpstreamSetting("top_k", 0, "GRPOConfig.top_k"),
        UpstreamSetting("beta", 0.0, "GRPOConfig.beta"),
        UpstreamSetting("use_bias_correction_kl", True, "GRPOConfig.use_bias_correction_kl"),
        UpstreamSetting("tempered_logprobs", True, "log-probs at the sampling temperature"),
        UpstreamSetting("gradient_checkpointing", True, "GRPOConfig.gradient_checkpointing"),
        UpstreamSetting("moe_aux_loss_weight", 0.0, "router-logits aux loss only (MiniMind returns none)"),
        UpstreamSetting("logging_steps", 10, "GRPOConfig.logging_steps"),
        UpstreamSetting("save_steps", 500, "TrainingArguments.save_steps"),
    ),
    notes=(
        "TRL has no default reward: `reward_funcs` (or environments with `get_reward`) are always the caller's.",
        "`steps_per_generation` unset generates once per optimizer step (every `gradient_accumulation_steps`).",
        "`bf16` unset is chosen per machine as for every run (docs/cpu.md): TRL's bf16 on GPUs.",
    ),
)

GENERATIONS = {generation.name: generation for generation in (MINIMIND2, MINIMIND3, MINIMIND3_AGENT)}
UPSTREAMS = {**GENERATIONS, TRL_DEFAULTS.name: TRL_DEFAULTS}  # what `upstream:` may name
DEFAULTS_GENERATION = "minimind2"  # the generation `MiniMindGRPOConfig`'s defaults follow
ARCHITECTURE_GENERATIONS = {"minimind2": MINIMIND2, "minimind3": MINIMIND3}  # each architecture's own GRPO


def get_generation(name: str | None) -> Generation:
    """The record of `name` (None: the one the config's defaults follow)."""
    name = DEFAULTS_GENERATION if name is None else name
    if name not in UPSTREAMS:
        raise ValueError(f"unknown upstream generation {name!r}; known: {', '.join(UPSTREAMS)}")
    return UPSTREAMS[name]


# --------------------------------------------------------------------------- comparing a run


@dataclass(frozen=True)
class Comparison:
    name: str
    run_value: Any
    upstream_value: Any
    flag: str
    same: bool


_NOT_AVAILABLE = "not available"


def _run_value(setting: UpstreamSetting, training_args, script_args):
    if setting.name == "steps_per_generation" and setting.kind == DERIVED:  # TRL's: one generation per optimizer step
        steps = training_args.steps_per_generation
        return "gradient_accumulation_steps" if steps == training_args.gradient_accumulation_steps else steps
    read = getattr(training_args, "setting_value", None)  # MiniMindGRPOConfig's: derived settings computed
    if read is not None and setting.kind != SCRIPT and hasattr(training_args, setting.name):
        return read(setting.name)
    for source in (training_args, script_args) if setting.kind == TRAINING else (script_args, training_args):
        if source is not None and hasattr(source, setting.name):
            return getattr(source, setting.name)
    return _NOT_AVAILABLE


def same_value(a, b) -> bool:
    """Equal as settings: enums by value, numbers within rounding, lists and tuples alike, a run's precision as
    upstream's on the same device (`DevicePrecision`)."""
    if isinstance(b, DevicePrecision):
        return b.matches(a)
    if isinstance(a, Enum):
        a = a.value
    if isinstance(a, list):
        a = tuple(a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def compare(generation: Generation, training_args, script_args=None) -> list[Comparison]:
    """Every setting of `generation` against a run. Script-level rows need `script_args` (the command's); without
    them (a Python run) they are left out."""
    rows = []
    for setting in generation.rows():
        if setting.kind == SCRIPT and script_args is None:
            continue
        value = _run_value(setting, training_args, script_args)
        rows.append(Comparison(setting.name, value, setting.value, setting.flag, same_value(value, setting.value)))
    return rows


def deviations(generation: Generation, training_args, script_args=None) -> list[Comparison]:
    return [row for row in compare(generation, training_args, script_args) if not row.same]


# --------------------------------------------------------------------------- rendering


def format_value(value) -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(item) for item in value)
    return str(value)


def render_generations_table(generations=None) -> str:
    """The generations side by side, one row per setting (`—`: the generation has no such setting), then their
    notes. `docs/generations.md` holds exactly this text."""
    generations = list(GENERATIONS.values() if generations is None else generations)
    names = []
    for generation in generations:  # each generation's new rows right after its row before them
        at = 0
        for row in generation.rows():
            if row.name in names:
                at = names.index(row.name) + 1
            else:
                names.insert(at, row.name)
                at += 1
    lines = [
        "| setting | " + " | ".join(generation.title for generation in generations) + " |",
        "|---|" + "---|" * len(generations),
    ]
    for name in names:
        cells = []
        for generation in generations:
            row = generation.setting(name)
            cells.append("—" if row is None else f"`{format_value(row.value)}` ({row.flag})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for generation in generations:
        lines += ["", f"{generation.title}:"]
        lines += [f"- {note}" for note in generation.notes]
    return "\n".join(lines) + "\n"


__all__ = [
    "ARCHITECTURE_GENERATIONS",
    "DEFAULTS_GENERATION",
    "UPSTREAM_PRECISION",
    "GENERATIONS",
    "TRL_DEFAULTS",
    "UPSTREAMS",
    "Comparison",
    "DevicePrecision",
    "Generation",
    "RunPrecision",
    "UpstreamSetting",
    "compare",
    "deviations",
    "format_value",
    "get_generation",
    "render_generations_table",
    "same_value",
]

if __name__ == "__main__":
    print(render_generations_table(), end="")
