"""The models: MiniMind itself (`minimind`) and the reward model upstream's GRPO scores with (`internlm2_reward`)."""
