"""Every private member of TRL (and of transformers' `Trainer` under it, and its `CompileConfig`) that minimind_trl
relies on, in one table, checked against the installed versions.

TRL's `GRPOTrainer` has no public hook for what MiniMind's GRPO changes (rollouts in eval mode, the rewards'
checks, the advantages, the loss, the prompt cut, exact resumes), so `MiniMindGRPOTrainer` and its
`CheckpointedTraining` mixin override private methods, read private attributes, and `trl_overrides` swaps
functions of TRL's module while `GRPOTrainer.__init__` runs. Each is a break waiting for a TRL release, so:

* `PRIVATE_MEMBERS` names every one: the class (or module) that owns it, what kind it is, the parameters we call
  or override it with (`parameters`: the leading ones, in order, positionally; `keywords`: by name) and why;
* code outside the trainer subclass reaches them only through the accessors below (`metrics`,
  `logged_advantages`, `parsing_tokenizer`, `set_parsing_tokenizer`, `generate_single_turn`,
  `compile_on_any_device`);
* `check_trl_private()` verifies the table against the installed TRL and transformers: a member gone, no longer a
  method, or whose parameters changed is one `TRLPrivateMemberChanged` naming the member, its class, the
  installed version and what changed (`tests/trainer/test_trl_private.py` runs it, and fails when a private
  `._name` of TRL's is used in the package without being listed here).

Attributes set in `__init__` have no class-level definition to inspect; they are checked by their assignment
(`self.<name> =`) in the owner's source.
"""

import functools
import importlib
import inspect
import re
from dataclasses import dataclass

from ..errors import MiniMindTRLError

GRPO = "trl.GRPOTrainer"
TRAINER = "transformers.Trainer"
TRL_GRPO_MODULE = "trl.trainer.grpo_trainer"
VLLM_GENERATION_MODULE = "trl.generation.vllm_generation"


class TRLPrivateMemberChanged(MiniMindTRLError):
    """The installed TRL or transformers no longer has a private member minimind_trl relies on, as listed in
    `PRIVATE_MEMBERS`."""


@dataclass(frozen=True)
class PrivateMember:
    """`owner` (a class as `package.Class`, or a module): `name`, of `kind` "method", "class attribute",
    "attribute" (set in `__init__`), "module function" or "module attribute" (both swapped while
    `GRPOTrainer.__init__` runs)."""

    owner: str
    name: str
    kind: str
    why: str
    parameters: tuple[str, ...] = ()  # the leading parameters after `self`, in this order
    keywords: tuple[str, ...] = ()  # parameters passed or received by name


PRIVATE_MEMBERS = (
    # -- TRL's GRPOTrainer: methods MiniMindGRPOTrainer overrides (and calls through super()) --
    PrivateMember(GRPO, "_generate_single_turn", "method", "rollouts in eval mode, through the lean sampler; the "
                  "agent rollout generates one turn with it (`generate_single_turn`)",
                  ("prompt_ids", "images", "multimodal_fields", "num_generations")),
    PrivateMember(GRPO, "_tool_call_loop", "method", "the calls TRL's tool loop left unanswered are logged",
                  ("prompts", "prompt_ids", "completion_ids", "completions", "logprobs")),
    PrivateMember(GRPO, "_tokenize_prompts", "method", "prompts cut to their last max_prompt_length tokens",
                  ("prompts",)),
    PrivateMember(GRPO, "_calculate_rewards", "method", "reward functions checked; rewards kept for the estimator",
                  ("inputs", "prompts", "completions", "completion_ids_list")),
    PrivateMember(GRPO, "_generate_and_score_completions", "method", "registered advantage estimators, dynamic "
                  "sampling", ("inputs",)),
    PrivateMember(GRPO, "_compute_loss", "method", "registered policy losses and the MoE aux loss", ("model", "inputs")),
    PrivateMember(GRPO, "_get_per_token_logps_and_entropies", "method", "attention past EOS, shared prompts; the "
                  "registered loss asks for entropies", ("model", "input_ids", "attention_mask", "logits_to_keep"),
                  ("compute_entropy",)),
    PrivateMember(GRPO, "_tag_names", "class attribute", "the model card's tags (`['trl', 'grpo', 'minimind']`)"),
    # -- TRL's GRPOTrainer: attributes set in __init__ --
    PrivateMember(GRPO, "_metrics", "attribute", "our metrics logged beside TRL's ({mode: {name: [values]}})"),
    PrivateMember(GRPO, "_logs", "attribute", "the completions table's advantages column (`_logs['advantages']`, a "
                  "deque) shows a registered estimator's advantages"),
    PrivateMember(GRPO, "_tokenizer", "attribute", "the tokenizer TRL parses completions with (a copy without the "
                  "response template when no tools run); its pad token for dynamic sampling's merge"),
    # -- transformers' Trainer: methods CheckpointedTraining overrides --
    PrivateMember(TRAINER, "_get_train_sampler", "method", "per-epoch reseeded prompt order", ("train_dataset",)),
    PrivateMember(TRAINER, "_run_epoch", "method", "the epoch reaches the sampler and the prompt renderer",
                  ("model", "epoch"), ("epoch",)),
    PrivateMember(TRAINER, "_load_optimizer_and_scheduler", "method", "inexact resumes refused or accepted",
                  ("checkpoint",)),
    PrivateMember(TRAINER, "_load_rng_state", "method", "inexact resumes refused or accepted", ("checkpoint",)),
    PrivateMember(TRAINER, "_issue_warnings_after_load", "method", "tied weights not reported missing",
                  ("load_result",)),
    PrivateMember(TRAINER, "_get_output_dir", "method", "the run folder of staged saves", ("trial",)),
    PrivateMember(TRAINER, "_push_from_checkpoint", "method", "pushes of complete checkpoints only",
                  ("checkpoint_folder",)),
    PrivateMember(TRAINER, "_save_checkpoint", "method", "checkpoints staged, appearing only when complete",
                  ("model", "trial")),
    PrivateMember(TRAINER, "_save", "method", "FSDP2's gathered weights saved as the policy's own class, tied once",
                  ("output_dir", "state_dict"), ("state_dict",)),
    # -- module functions trl_overrides swaps while GRPOTrainer.__init__ runs (no argument for them) --
    PrivateMember(TRL_GRPO_MODULE, "add_fused_lm_head", "module function", "log-probs at the scoring temperature",
                  ("model",), ("temperature",)),
    PrivateMember(TRL_GRPO_MODULE, "create_model_from_path", "module function", "the reference of an in-memory "
                  "policy is its copy", ("model_id",)),
    PrivateMember(TRL_GRPO_MODULE, "add_response_schema", "module function", "MiniMind's response template",
                  ("processing_class",)),
    PrivateMember(VLLM_GENERATION_MODULE, "LLM", "module attribute", "a colocated vLLM engine's dtype and "
                  "log-probs mode"),
    # -- transformers' generation: the switch its own tests use to compile `generate` off accelerators --
    PrivateMember("transformers.CompileConfig", "_compile_all_devices", "class attribute", "compile_generation "
                  "compiles on any device, CPU included"),
)


# --- accessors: the private attributes as code outside the trainer subclass reads them ---------------------------


def metrics(trainer, mode: str):
    """`{name: [values]}` of `mode` ("train"/"eval"): what TRL averages and logs at the next logging step."""
    return trainer._metrics[mode]


def logged_advantages(trainer):
    """The completions table's advantages column (a deque TRL fills per generation batch)."""
    return trainer._logs["advantages"]


def parsing_tokenizer(trainer):
    """The tokenizer TRL decodes and parses completions with (a processor's own tokenizer)."""
    return trainer._tokenizer


def set_parsing_tokenizer(trainer, tokenizer) -> None:
    trainer._tokenizer = tokenizer


def generate_single_turn(trainer, prompt_ids: list[list[int]]):
    """One generation turn for already-tokenized text-only contexts, one completion each: `(completion_ids,
    logprobs or None)`. TRL's `_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)`:
    no images, no multimodal fields, and `num_generations=1` because the contexts are already repeated per
    generation (each is its own transcript)."""
    return trainer._generate_single_turn(prompt_ids, images=None, multimodal_fields={}, num_generations=1)


# --- the check -----------------------------------------------------------------------------------------------


def _owner(member: PrivateMember):
    if member.kind.startswith("module"):
        return importlib.import_module(member.owner)
    package, _, name = member.owner.rpartition(".")
    return getattr(importlib.import_module(package), name)


def _versions() -> str:
    import transformers
    import trl

    return f"TRL {trl.__version__}, transformers {transformers.__version__}"


def _signature_change(member: PrivateMember, function) -> str | None:
    try:
        parameters = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None  # nothing readable to compare
    if parameters[:1] == ["self"]:
        parameters = parameters[1:]
    leading = parameters[: len(member.parameters)]
    if tuple(leading) != member.parameters:
        return f"its leading parameters are ({', '.join(leading)}), we rely on ({', '.join(member.parameters)})"
    missing = [name for name in member.keywords if name not in parameters]
    if missing:
        return f"it has no parameter {', '.join(missing)} (its parameters: {', '.join(parameters)})"
    return None


@functools.cache
def _class_sources(cls) -> str:
    """The source of `cls` and of the TRL and transformers classes it derives from."""
    classes = [base for base in cls.__mro__ if base.__module__.split(".")[0] in ("trl", "transformers")]
    return "\n".join(inspect.getsource(base) for base in classes)


def member_problem(member: PrivateMember) -> str | None:
    """What changed for `member` in the installed TRL/transformers, or None."""
    owner = _owner(member)
    if member.kind == "attribute":
        sources = _class_sources(owner)
        if not re.search(rf"\bself\.{re.escape(member.name)}\s*(?::[^=\n]+)?=[^=]", sources):
            return "it is no longer set by the class (no `self.%s =` in its source)" % member.name
        return None
    if member.kind == "module attribute":
        source = inspect.getsource(owner)
        return None if re.search(rf"\b{re.escape(member.name)}\b", source) else "the module no longer defines it"
    if member.kind == "class attribute":  # its value may be None (CompileConfig's switch)
        return None if hasattr(owner, member.name) else "it no longer exists"
    value = getattr(owner, member.name, None)
    if value is None:
        return "it no longer exists"
    if not callable(value):
        return f"it is no longer a {member.kind} (a {type(value).__name__})"
    return _signature_change(member, value)


def check_trl_private(members=PRIVATE_MEMBERS) -> None:
    """Every member of `members` as the table says, in the installed TRL and transformers; else one
    `TRLPrivateMemberChanged` naming each member that changed, its owner, the versions and what changed."""
    problems = [
        f"{member.owner}.{member.name} ({member.kind}, used for: {member.why}): {problem}"
        for member in members
        if (problem := member_problem(member))
    ]
    if problems:
        raise TRLPrivateMemberChanged(
            f"the installed {_versions()} changed private members minimind_trl relies on "
            f"(minimind_trl/trainer/trl_private.py): " + "; ".join(problems)
        )


def compile_on_any_device(compile_config) -> None:
    """Let `generate` compile with `compile_config` on any device (transformers compiles on some accelerators only)."""
    compile_config._compile_all_devices = True


__all__ = [
    "PRIVATE_MEMBERS",
    "PrivateMember",
    "TRLPrivateMemberChanged",
    "check_trl_private",
    "compile_on_any_device",
    "generate_single_turn",
    "logged_advantages",
    "member_problem",
    "metrics",
    "parsing_tokenizer",
    "set_parsing_tokenizer",
]
