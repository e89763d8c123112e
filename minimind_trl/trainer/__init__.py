"""The GRPO trainer: upstream MiniMind's `train_grpo.py` as a TRL `GRPOTrainer`.

* `grpo_config`: `MiniMindGRPOConfig`, upstream's defaults and MiniMind's switches;
* `grpo_trainer`: `MiniMindGRPOTrainer` (rollouts, rewards, advantages, loss, checkpoints, model card);
* `trl_overrides`: what is substituted inside TRL's constructor;
* `algorithm/`: the registries a recipe picks by name (`advantages`, `policy_losses` with the `loss_kwargs` a loss
  declares, `loss_aggregation`, their common `seams` and a config's `seam_choice`) holding both upstream
  generations' arithmetic, and DAPO's `dynamic_sampling`;
* `speed/`: the lean sampler (`fast_sampling`, `decode_kernel`), the completion-only log-prob head
  (`fast_logprobs`), bf16 or fp32 on CPU (`cpu_precision`), each prompt once per group (`prompt_sharing`);
* `outputs/`: the output folder, its lock and the resume checks (`output_dir`, `run_lock`, `run_safety`), crash-safe
  checkpoints and resume (`checkpointing`, `checkpointed_training`, `run_identity`), the model card (`model_card`);
* `rollouts/`: vLLM (`vllm_rollouts`) and the agent's tool-loop checks (`tool_loop_checks`);
* `checks/`: numeric ranges (`config_ranges`), optional packages (`extras`), models and reward functions
  (`reward_checks`).

The extension points (a new estimator, loss or aggregation registered from the user's own module) are importable
from here.
"""

from .algorithm.advantages import AdvantageInputs, minimind_advantages, register_adv_est
from .algorithm.loss_aggregation import LossScale, register_loss_aggregation
from .algorithm.policy_losses import PolicyLossInputs, register_policy_loss
from .grpo_config import MiniMindGRPOConfig

__all__ = [
    "AdvantageInputs",
    "LossScale",
    "MiniMindGRPOConfig",
    "MiniMindGRPOTrainer",
    "PolicyLossInputs",
    "minimind_advantages",
    "register_adv_est",
    "register_loss_aggregation",
    "register_policy_loss",
]


def __getattr__(name: str):
    # The trainer (TRL's GRPOTrainer, datasets, pandas) is imported when first named, so that the config and the
    # checks, which `minimind-trl grpo --help` builds its parser from, come without it.
    if name == "MiniMindGRPOTrainer":
        from .grpo_trainer import MiniMindGRPOTrainer

        return MiniMindGRPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
