"""Whether a demo run learnt what its summary reports, said plainly. A run that did not learn names what fell short
and what to try, and the demo exits with `DID_NOT_LEARN_EXIT_CODE` instead of 0.

What each demo's summary is about (docs/demo.md has every seed's figures on two CPU kinds):

* `--rewards full` (the default): on the held-out prompts the total reward and the exact layout's term rise, and
  the logged reward's last 10 steps beat its first 10 by `MIN_REWARD_GAIN`;
* `--rewards rules`: the logged reward gains `MIN_REWARD_GAIN`;
* `--upstream minimind3`: the share of held-out answers in the question's language rises by `MIN_LANGUAGE_GAIN`;
* `--agent`: the held-out rollouts' valid calls do not drop and their correct answers rise by `MIN_CORRECT_GAIN`.

GRPO learns from the spread of rewards within a group of completions of one prompt. A run whose groups all start
without any (every completion rewarded alike: a warm start that never samples what the reward pays for) cannot
learn; `GroupSpreadWatch` stops GRPO after `SPREAD_PATIENCE` such steps instead of training on nothing.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback

DID_NOT_LEARN_EXIT_CODE = 1
MIN_REWARD_GAIN = 0.5
MIN_LANGUAGE_GAIN = 0.3
MIN_CORRECT_GAIN = 0.10
SPREAD_PATIENCE = 10
TOLERANCE = 1e-9  # shares are ratios of counts: 13/128 - 12/128 is "at least 0.10" short by rounding only


class GroupSpreadWatch(TrainerCallback):
    """Stops GRPO when each of its first `patience` steps (all of them in a shorter run) had no spread in any group:
    TRL logs `frac_reward_zero_std`, the share of completions whose group's rewards are all equal."""

    def __init__(self, patience: int = SPREAD_PATIENCE):
        self.patience = patience
        self.flat_steps = 0  # leading steps without spread in any group
        self.flat_reward: float | None = None  # the reward of the last such step
        self.stalled = False
        self._watching = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._watching or not logs or "frac_reward_zero_std" not in logs:
            return
        if logs["frac_reward_zero_std"] < 1.0:
            self._watching = False
            return
        self.flat_steps += 1
        self.flat_reward = logs.get("reward")
        if self.flat_steps >= min(self.patience, state.max_steps):
            self.stalled, self._watching = True, False
            control.should_training_stop = True

    def shortfall(self, num_generations: int) -> str | None:
        """What went wrong, when GRPO stalled."""
        if not self.stalled:
            return None
        reward = "" if self.flat_reward is None else f" ({self.flat_reward:.3f} on the last)"
        return (f"GRPO stopped after {self.flat_steps} steps with no spread in any group: every group of "
                f"{num_generations} completions got one reward{reward}, so there was nothing to prefer")


@dataclass(frozen=True)
class RunVerdict:
    """What fell short (one clause each; none when the run learnt) and what to try."""

    shortfalls: tuple[str, ...]
    advice: str = ""
    met: str = ""  # the demo's bars that were met, for the closing line

    @property
    def learned(self) -> bool:
        return not self.shortfalls

    def lines(self) -> list[str]:
        """The closing line when the run learnt; otherwise what fell short and what to try (for stderr)."""
        if self.learned:
            return [f"Learned: {self.met}."]
        lines = ["this run did not learn:"] + [f"  - {shortfall}" for shortfall in self.shortfalls]
        return lines + [f"What to try: {self.advice}"]


def _moved(before: float, after: float, fmt: str = "{:+.3f}") -> str:
    return f"{fmt.format(before)} -> {fmt.format(after)}"


def grpo_verdict(summary: dict, stall: str | None, warm_start_steps: int, max_steps: int) -> RunVerdict:
    """The verdict of `minimind-trl demo` (`--rewards full|rules`, `--upstream minimind3`) from its summary."""
    kind, shortfalls, met = summary["rewards"], [stall] if stall else [], []
    gain = summary.get("reward_gain")
    if kind in ("full", "rules"):
        window = summary.get("reward_window")
        if gain is None:
            shortfalls.append("GRPO logged fewer than 2 steps, so the reward's gain is unknown")
        elif gain < MIN_REWARD_GAIN:
            shortfalls.append(f"the reward's last {window} steps beat its first {window} by {gain:+.3f} (the demo's "
                              f"bar: +{MIN_REWARD_GAIN})")
        else:
            met.append(f"reward {gain:+.3f} (last vs first {window} steps)")
    if kind == "full":
        terms = summary.get("held_out_terms") or {}
        for name, label in (("reward", "the weighted total"), ("format_reward", "the exact layout's term")):
            before, after = terms.get(name, (None, None))
            if before is None or not after > before:
                shown = "not measured" if before is None else _moved(before, after)
                shortfalls.append(f"on the held-out prompts {label} did not rise ({shown})")
            else:
                met.append(f"held-out {name.removesuffix('_reward')} {_moved(before, after)}")
    if kind == "minimind3":
        content_gain = summary["content_gain"]
        language = _moved(summary["content_before"], summary["content_after"], "{:.0%}")
        if content_gain < MIN_LANGUAGE_GAIN - TOLERANCE:
            shortfalls.append(f"the held-out answers in the question's language rose by {content_gain:+.2f} "
                              f"({language}; the demo's bar: +{MIN_LANGUAGE_GAIN})")
        else:
            met.append(f"held-out answers in the question's language {language}")
    return RunVerdict(tuple(shortfalls), _advice(stall, warm_start_steps, max_steps), ", ".join(met))


def agent_verdict(summary: dict, stall: str | None, warm_start_steps: int, max_steps: int) -> RunVerdict:
    """The verdict of `minimind-trl demo --agent` from its summary."""
    shortfalls, met = [stall] if stall else [], []
    valid = (summary["valid_call_rate_before"], summary["valid_call_rate_after"])
    correct = (summary["correct_answer_rate_before"], summary["correct_answer_rate_after"])
    shown_valid, shown_correct = (_moved(*pair, "{:.0%}") for pair in (valid, correct))
    if valid[1] < valid[0]:
        shortfalls.append(f"held-out valid tool calls dropped ({shown_valid})")
    else:
        met.append(f"held-out valid tool calls {shown_valid}")
    if correct[1] - correct[0] < MIN_CORRECT_GAIN - TOLERANCE:
        shortfalls.append(f"held-out correct answers rose by {correct[1] - correct[0]:+.2f} ({shown_correct}; the "
                          f"demo's bar: +{MIN_CORRECT_GAIN:.2f})")
    else:
        met.append(f"correct answers {shown_correct}")
    return RunVerdict(tuple(shortfalls), _advice(stall, warm_start_steps, max_steps), ", ".join(met))


def _advice(stall: str | None, warm_start_steps: int, max_steps: int) -> str:
    if stall:
        return (f"the warm start ({warm_start_steps} SFT steps) left a model that never samples what the reward pays "
                f"for: a longer warm start (--warm_start_steps, more than {warm_start_steps}) or another --seed.")
    return (f"more GRPO steps (--steps, more than {max_steps}) or another --seed; docs/demo.md lists the seeds "
            "measured and what each demo learnt on them.")


def record(path: Path, summary: dict, verdict: RunVerdict) -> dict:
    """`summary.json` again with the verdict: `learned`, `shortfalls`."""
    summary.update(learned=verdict.learned, shortfalls=list(verdict.shortfalls))
    Path(path).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


__all__ = [
    "DID_NOT_LEARN_EXIT_CODE",
    "GroupSpreadWatch",
    "RunVerdict",
    "agent_verdict",
    "grpo_verdict",
    "record",
]
