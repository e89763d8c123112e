"""Dynamic sampling (DAPO): replace groups without spread by groups drawn for further prompts.

A group whose completions all got the same reward has advantage 0: it teaches nothing, and with a weak policy it
is most groups. With `dynamic_sampling: true` the trainer generates further rounds, each a whole generation batch
for prompts drawn at random from the training set, until every group slot of the batch holds a group with spread
or `max_resample_rounds` rounds were spent. A slot keeps the first group with spread drawn at its own position
(same rows on the same processes, so nothing moves between processes); a slot still without spread after the cap
keeps its first group, with advantage 0 as without dynamic sampling. The merged batch's advantages are the
configured estimator's, on the kept groups' rewards.

The refill prompts depend only on `seed`, the optimizer step and the generation's index within it, so a resumed
run draws exactly what the uninterrupted run drew.

Every round is logged (INFO), and a step that needs more than `WARN_AFTER_ROUNDS` rounds warns (again each time
the count doubles): with a constant reward and a large `max_resample_rounds` no step would end for a long time,
and the user should see why nothing moves.
"""

import logging
import zlib

import torch

from ...errors import RecipeError
from ..trl_private import metrics, parsing_tokenizer
from .advantages import zero_spread_rows

PROMPT_KEYS = ("prompt_ids", "prompt_mask")  # left-padded
COMPLETION_KEYS = ("completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps")  # right
RECOMPUTED_KEYS = ("advantages", "num_items_in_batch")
WARN_AFTER_ROUNDS = 3

logger = logging.getLogger(__name__)


def refill_rows(dataset, num_groups: int, num_generations: int, local: slice, seed: int, key: tuple) -> list[dict]:
    """This process's rows of a refill round: `num_groups` prompts drawn (with replacement) from `dataset`, each
    repeated `num_generations` times as TRL's sampler lays a generation batch out, then sliced to `local`."""
    generator = torch.Generator().manual_seed(zlib.crc32(repr((seed, *key)).encode()))
    indices = torch.randint(len(dataset), (num_groups,), generator=generator)
    return [dataset[int(index)] for index in indices.repeat_interleave(num_generations)[local].tolist()]


def choose_rounds(no_spread_per_round: list[torch.Tensor]) -> torch.Tensor:
    """Per group slot, the first round whose group there has spread; round 0 where none has."""
    choice = torch.zeros_like(no_spread_per_round[0], dtype=torch.long)
    pending = no_spread_per_round[0].clone()
    for index, no_spread in enumerate(no_spread_per_round[1:], start=1):
        choice[pending & ~no_spread] = index
        pending &= no_spread
    return choice


def _pad(tensor: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    missing = width - tensor.size(1)
    if missing == 0:
        return tensor
    filler = tensor.new_full((tensor.size(0), missing), value)
    return torch.cat([filler, tensor] if left else [tensor, filler], dim=1)


def merge_rounds(outputs: list[dict], row_round: torch.Tensor, pad_token_id: int) -> dict:
    """One local batch whose row i is row i of round `row_round[i]`: prompts re-padded on the left, completions
    and per-token tensors on the right. `advantages` and `num_items_in_batch` are left for the caller."""
    unsupported = sorted(set(outputs[0]) - set(PROMPT_KEYS + COMPLETION_KEYS + RECOMPUTED_KEYS))
    if unsupported:
        raise RecipeError(
            f"dynamic_sampling cannot merge the generation batch's {', '.join(unsupported)} (multimodal prompts, "
            "tools or vLLM importance sampling); set dynamic_sampling: false for this run"
        )
    rows = torch.arange(row_round.numel(), device=row_round.device)
    merged = {}
    for key in outputs[0]:
        if key in RECOMPUTED_KEYS:
            continue
        left = key in PROMPT_KEYS
        value = pad_token_id if key in ("prompt_ids", "completion_ids") else 0
        width = max(output[key].size(1) for output in outputs)
        stacked = torch.stack([_pad(output[key], width, value, left) for output in outputs])
        merged[key] = stacked[row_round.to(stacked.device), rows.to(stacked.device)]
    return merged


def _log_round(trainer, step: int, round_number: int, pending: int, groups: int) -> None:
    """Say that round `round_number` is about to be generated, and warn when a step needs many (main process)."""
    if not trainer.accelerator.is_main_process:
        return
    cap = trainer.args.max_resample_rounds
    logger.info(
        "dynamic sampling, step %d: resample round %d of at most %d (%d of %d groups still without spread)",
        step, round_number, cap, pending, groups,
    )  # fmt: skip
    power_of_two = round_number & (round_number - 1) == 0
    if round_number == WARN_AFTER_ROUNDS + 1 or (round_number > WARN_AFTER_ROUNDS and power_of_two):
        logger.warning(
            "dynamic sampling: step %d needs resample round %d (of at most max_resample_rounds=%d): %d of %d groups "
            "still got the same reward for every completion (a constant or saturated reward?); each round generates "
            "a whole batch, so the step takes that much longer. Lower max_resample_rounds or check the rewards.",
            step, round_number, cap, pending, groups,
        )  # fmt: skip


def refill(trainer, inputs) -> tuple[dict, torch.Tensor]:
    """`trainer`'s generation batch for `inputs` (this process's rows) with its groups without spread replaced,
    and, per gathered row, the round it comes from. `trainer._scored` gives each round's local output and gathered
    rewards; every process runs the same rounds, decided on the gathered rewards."""
    if not hasattr(trainer.train_dataset, "__len__"):
        raise RecipeError("dynamic_sampling draws refill prompts by index: it needs a map-style train_dataset")
    num_local, num_generations = len(inputs), trainer.num_generations
    local = trainer._local_rows(num_local)
    num_groups = num_local * trainer.accelerator.num_processes // num_generations
    step = trainer.state.global_step
    if trainer._refill_step != step:  # the key restarts at every optimizer step, where a resume starts too
        trainer._refill_step, trainer._refill_count = step, 0
    key, trainer._refill_count = (step, trainer._refill_count), trainer._refill_count + 1

    def no_spread_groups_of(rewards):
        return zero_spread_rows(rewards, num_generations).view(-1, num_generations)[:, 0]

    rounds = [trainer._scored(inputs, "train")]
    no_spread_groups = [no_spread_groups_of(rounds[0][1])]
    pending = no_spread_groups[0].clone()
    while bool(pending.any()) and len(rounds) <= trainer.args.max_resample_rounds:
        _log_round(trainer, step + 1, len(rounds), int(pending.sum()), pending.numel())
        round_key = (*key, len(rounds))
        rows = refill_rows(trainer.train_dataset, num_groups, num_generations, local, trainer.args.seed, round_key)
        rounds.append(trainer._scored(rows, "train"))
        no_spread_groups.append(no_spread_groups_of(rounds[-1][1]))
        pending &= no_spread_groups[-1]

    row_round = choose_rounds(no_spread_groups).repeat_interleave(num_generations)
    everyone = torch.arange(row_round.numel(), device=row_round.device)
    rewards = torch.stack([round_rewards for _, round_rewards in rounds])[row_round, everyone]
    output = merge_rounds([out for out, _ in rounds], row_round[local], parsing_tokenizer(trainer).pad_token_id)
    output["advantages"] = trainer._advantages(rewards, "train")[local]
    output["num_items_in_batch"] = trainer.accelerator.gather(output["completion_mask"].sum()).sum()
    logged = metrics(trainer, "train")
    logged["dynamic_sampling/zero_spread_before"].append(no_spread_groups[0].float().mean().item())
    logged["dynamic_sampling/zero_spread_after"].append(pending.float().mean().item())
    logged["dynamic_sampling/extra_completions"].append(float((len(rounds) - 1) * row_round.numel()))
    return output, row_round


__all__ = ["choose_rounds", "merge_rounds", "refill", "refill_rows"]
