"""The GRPO trainer: upstream MiniMind's `train_grpo.py` as a TRL `GRPOTrainer`.

* `grpo_config`: `MiniMindGRPOConfig`, upstream's defaults and MiniMind's switches;
* `grpo_trainer`: `MiniMindGRPOTrainer` (rollouts, rewards, advantages, loss, checkpoints, model card);
* `advantages` / `policy_losses` / `loss_aggregation`: registries of pure functions (`register_adv_est`,
  `register_policy_loss`, `register_loss_aggregation`) holding both upstream generations' arithmetic
  (`minimind_trl.generations` records which one each generation uses); `seams`: what the three have in common
  (names, `package.module:function` values imported and checked); `seam_choice`: a config's three, resolved before
  it validates them and named for the model card and the run record;
* `fast_sampling` / `decode_kernel` / `fast_logprobs`: the lean rollout sampler, its packed MiniMind decoding
  step and the completion-only log-prob head;
* `cpu_precision`: bf16 or fp32 on CPU, chosen from what this CPU computes fast (`bf16` unset);
* `checkpointing`: crash-safe checkpoints and resume checks; `model_card`: the run's card section;
* `trl_overrides`: what is substituted inside TRL's constructor.
"""

from .advantages import minimind_advantages
from .grpo_config import MiniMindGRPOConfig
from .grpo_trainer import MiniMindGRPOTrainer

__all__ = ["MiniMindGRPOConfig", "MiniMindGRPOTrainer", "minimind_advantages"]
