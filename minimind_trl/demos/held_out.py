"""What the demo's GRPO changed, measured on prompts it did not train on: completions sampled for the held-out
prompts (as GRPO samples, the same sampling seed before and after) scored with every reward term of the run — the
trainer's own reward functions, the reward model included — and checked for the content property without the
reward model. The training log's first and last steps show the same terms on the prompts being trained on; these
show whether what was learned carries over.
"""

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HeldOutSample:
    """Completions sampled for the held-out prompts, `samples` per prompt (`questions[i]` asked `completions[i]`,
    whose token ids are `completion_ids[i]`, as TRL hands them to reward functions)."""

    questions: list[str]
    completions: list[str]
    completion_ids: list[list[int]]

    def share(self, in_language) -> float:
        """The share of completions with the content property (`in_language(question, completion)`)."""
        from .reward_model import content_share

        return content_share(self.questions, self.completions, in_language)


def sample_held_out(model, tokenizer, training_args, prompts: list[str], samples: int, seed: int,
                    chat_template_kwargs=None) -> HeldOutSample:
    """`samples` completions per prompt, sampled as GRPO samples from `seed` (the random stream is left alone)."""
    import torch

    from .model import generate_completion_ids

    questions = [prompt for prompt in prompts for _ in range(samples)]
    with torch.random.fork_rng():
        completions, ids = generate_completion_ids(
            model, tokenizer, training_args, questions, seed, chat_template_kwargs
        )
    return HeldOutSample(questions, completions, ids)


def reward_terms(reward_funcs, reward_func_names, reward_weights, sample: HeldOutSample) -> dict[str, float]:
    """Each reward function's mean over `sample` under TRL's name (as it logs `rewards/<name>/mean`), then
    `reward`: the weighted sum of those means (the total TRL logs as `reward`). Completions a function returns
    None for stay out of its mean."""
    prompts = [[{"role": "user", "content": question}] for question in sample.questions]
    completions = [[{"role": "assistant", "content": completion}] for completion in sample.completions]
    terms = {}
    for func, name in zip(reward_funcs, reward_func_names):
        scored = func(prompts=prompts, completions=completions, completion_ids=sample.completion_ids)
        values = [value for value in scored if value is not None]
        terms[name] = sum(values) / len(values) if values else math.nan
    terms["reward"] = sum(float(weight) * terms[name] for name, weight in zip(reward_func_names, reward_weights))
    return terms


def held_out_terms(trainer, before: HeldOutSample, after: HeldOutSample) -> dict[str, list[float]]:
    """Each reward term of `trainer` (and the weighted total, `reward`) -> [mean before GRPO, mean after]."""
    names, weights = trainer.reward_func_names, trainer.reward_weights.tolist()
    first = reward_terms(trainer.reward_funcs, names, weights, before)
    last = reward_terms(trainer.reward_funcs, names, weights, after)
    return {name: [first[name], last[name]] for name in first}


def held_out_lines(terms: dict[str, list[float]], completions: int, prompts: int, trained_on: bool) -> list[str]:
    """The summary's table of `held_out_terms`, one term a line."""
    where = "of the prompts GRPO trained on" if trained_on else "held out from GRPO (and from the reward model)"
    lines = [f"Each reward term before -> after GRPO on {completions} completions for {prompts} prompts {where}:"]
    width = max(len(name) for name in terms)
    for name, (first, last) in terms.items():
        label = "total (weighted sum)" if name == "reward" else name
        lines.append(f"  {label:<{max(width, 20)}}  {first:+.3f} -> {last:+.3f}  ({last - first:+.3f})")
    return lines


__all__ = ["HeldOutSample", "held_out_lines", "held_out_terms", "reward_terms", "sample_held_out"]
