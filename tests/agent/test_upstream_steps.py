"""Whole steps of upstream's agent RL (`rollouts.jsonl`, every step the file holds) through the trainer's real code:
upstream's rollouts packed by `pack_rollout`, TRL's `_generate_and_score_completions` (padding, masks, the
`group_zscore` advantages), then `compute_loss` on the fixture's log-probs: masks, advantages, loss (1e-6) and the
gradient with respect to the log-probs (1e-5)."""

import pytest
import torch

from minimind_trl.agent.rollout import Transcript, pack_rollout

from agent_fixtures import EOS, ROLLOUTS_FILE, line_count, read_cases, step_trainer, upstream_tokenizer



@pytest.fixture(scope="module")
def steps():
    return read_cases(ROLLOUTS_FILE)


@pytest.fixture(scope="module")
def tokenizer():
    return upstream_tokenizer()


def upstream_transcript(rollout: dict) -> Transcript:
    """Upstream's rollout as `pack_rollout` takes it (its own, possibly shifted, observation slices included)."""
    last_turn = rollout["engine_calls"][-1]["completion_ids"]
    return Transcript(
        messages=[], tools=None, open_thinking=rollout["open_thinking"], prompt_ids=rollout["prompt_ids"],
        response_ids=rollout["response_ids"], response_mask=rollout["response_mask"],
        response_logps=rollout["response_old_logps"], turn_outputs=rollout["turn_outputs"],
        ended_with_eos=not rollout["unfinished"] and bool(last_turn) and last_turn[-1] == EOS,
        unfinished=rollout["unfinished"],
    )


def replaying(step: dict):
    """A `rollout_func` handing TRL upstream's rollouts of this step, packed as the agent rollout packs its own."""
    packed = [pack_rollout(upstream_transcript(r), step["args"]["max_total_len"], EOS) for r in step["rollouts"]]

    def rollout_func(prompts, trainer):
        assert len(prompts) == len(packed)
        return {
            "prompt_ids": [p.prompt_ids for p in packed],
            "completion_ids": [p.completion_ids for p in packed],
            "logprobs": [p.logprobs for p in packed],
            "env_mask": [p.env_mask for p in packed],
        }

    return rollout_func, packed


def fixture_rewards(step: dict):
    def reward(completions, **kwargs):
        return list(step["rewards"])

    return reward


def on_completion_positions(values: list[list[float]], packed, width: int) -> torch.Tensor:
    """Upstream's per-position values (position k scores token k + 1 of the packed sequence) at our completion
    positions: row i, completion token j is token len(prompt_i) + j of the sequence."""
    out = torch.zeros(len(packed), width)
    for i, rollout in enumerate(packed):
        for j in range(len(rollout.completion_ids)):
            k = len(rollout.prompt_ids) + j - 1
            if k < len(values[i]):
                out[i, j] = values[i][k]
    return out


def covered(values: list[list[float]], packed) -> torch.Tensor:
    """Upstream's values at the positions our completions do not cover (the prompt's): all must be zero."""
    return torch.tensor([sum(abs(v) for v in row[: len(p.prompt_ids) - 1]) for row, p in zip(values, packed)])


@pytest.mark.parametrize("index", range(line_count(ROLLOUTS_FILE)))
def test_upstream_step_through_the_trainer(steps, tokenizer, tmp_path, index):
    step = steps[index]
    rollout_func, packed = replaying(step)
    trainer = step_trainer(tmp_path, step, tokenizer, fixture_rewards(step), rollout_func)
    ref_logps = on_completion_positions(step["ref_per_token_logps"], packed, max(len(p.completion_ids) for p in packed))
    policy = {}

    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        values = ref_logps if model is trainer.ref_model else policy["logps"]
        assert values.shape == (len(packed), logits_to_keep)
        return values, torch.zeros_like(values.detach()), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies
    policy["logps"] = ref_logps  # the reference pass inside generation (beta != 0) reads the reference's
    rows = [{"prompt": step["samples"][i // step["args"]["num_generations"]]["messages"]}
            for i in range(len(packed))]
    generated = trainer._generate_and_score_completions(rows)

    torch.testing.assert_close(generated["advantages"], torch.tensor(step["advantages"]), rtol=0, atol=1e-6)
    width = generated["completion_ids"].size(1)
    loss_mask = trainer._loss_mask(generated)
    expected_mask = on_completion_positions(step["completion_mask"], packed, width)
    assert torch.equal(loss_mask.float(), expected_mask)
    assert torch.equal(covered(step["completion_mask"], packed), torch.zeros(len(packed)))
    assert loss_mask.sum(dim=1).tolist() == step["token_counts"]

    logps = on_completion_positions(step["per_token_logps"], packed, width).requires_grad_(True)
    policy["logps"] = logps
    loss = trainer.compute_loss(trainer.model, generated)
    loss.backward()
    assert abs(loss.item() - step["loss"]) <= 1e-6, (loss.item(), step["loss"])
    expected_grad = on_completion_positions(step["grad_per_token_logps"], packed, width)
    torch.testing.assert_close(logps.grad, expected_grad, rtol=0, atol=1e-5)
    assert torch.equal(covered(step["grad_per_token_logps"], packed), torch.zeros(len(packed)))
