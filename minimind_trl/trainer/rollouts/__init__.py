"""Rollout engines the trainer drives besides its own sampler: vLLM (colocated or a server), and the checks on an
agent's tool loop."""
