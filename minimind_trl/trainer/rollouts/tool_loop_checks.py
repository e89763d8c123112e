"""What TRL's own tool loop (`GRPOTrainer(tools=[...])`) drops silently, said once and logged each step.

TRL 1.16's `_tool_call_loop` runs a turn's calls, then drops their results when the call, the results and the room
for an answer do not fit in `max_completion_length` (or the model's context): the completion ends on the call, no
tool message is shown and no second turn is generated, and only `tools/call_frequency` says a call was made. It also
stops at `max_tool_calling_iterations` with the last turn's calls unanswered. `record_unanswered_calls` counts the
completions that end on an unanswered call after the loop: `tools/unanswered_by_length` (the share of completions cut
by the length budget) and `tools/unanswered_by_iterations` (cut by the iteration cap) are logged, and the first step
with any logs a warning that names the setting to raise.
"""

import logging

import torch

from ..trl_private import metrics

logger = logging.getLogger(__name__)


def _unanswered(completion) -> tuple[bool, int]:
    """Whether a completion (TRL's message list) ends on an assistant turn whose calls got no tool message, and how
    many assistant turns it holds."""
    if not isinstance(completion, list) or not completion:
        return False, 0
    assistant_turns = sum(1 for message in completion if message.get("role") == "assistant")
    last = completion[-1]
    return bool(last.get("role") == "assistant" and last.get("tool_calls")), assistant_turns


def unanswered_counts(completions, max_iterations: int | None) -> tuple[int, int]:
    """(completions cut by the length budget, completions cut by the iteration cap) after TRL's loop."""
    by_length = by_iterations = 0
    for completion in completions:
        unanswered, turns = _unanswered(completion)
        if unanswered:
            if max_iterations is not None and turns > max_iterations:
                by_iterations += 1
            else:
                by_length += 1
    return by_length, by_iterations


def record_unanswered_calls(trainer, completions) -> None:
    """Log the shares of completions whose last calls TRL's loop left unanswered, over every process; warn once."""
    max_iterations = getattr(trainer, "max_tool_calling_iterations", None)
    counts = unanswered_counts(completions, max_iterations)
    local = torch.tensor([*counts, len(completions)], dtype=torch.float32, device=trainer.accelerator.device)
    by_length, by_iterations, total = trainer.accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
    mode = "train" if trainer.model.training else "eval"
    metrics(trainer, mode)["tools/unanswered_by_length"].append(by_length / max(total, 1.0))
    metrics(trainer, mode)["tools/unanswered_by_iterations"].append(by_iterations / max(total, 1.0))
    if by_length and not getattr(trainer, "_warned_unanswered_calls", False):
        trainer._warned_unanswered_calls = True
        logger.warning(
            "TRL's tool loop left the calls of %d of %d completions unanswered: max_completion_length=%s cannot hold "
            "the call, the tool's result and an answer, so TRL dropped the result and generated no second turn (the "
            "policy is scored on a completion that ends on its call). Raise max_completion_length; "
            "tools/unanswered_by_length logs the share each step (warned once)",
            int(by_length), int(total), trainer.max_completion_length,
        )


__all__ = ["record_unanswered_calls", "unanswered_counts"]
