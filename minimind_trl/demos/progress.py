"""What `minimind-trl demo` shows and writes: a progress bar for each stage that runs steps (the reward model, the
warm start, GRPO with one line per step), `metrics.jsonl`, the reward curve, and the closing summary.

The numbers all come from the Trainer's own logs (TRL logs the total reward as `reward` and each reward function
as `rewards/<name>/mean`), so the demo reports exactly what `minimind-trl grpo` would log.
"""

import json
import math
import os
import re
from pathlib import Path

from tqdm.auto import tqdm
from transformers import TrainerCallback

from .held_out import held_out_lines

# (label on the per-step line, TRL log key, format)
STEP_FIELDS = (
    ("reward", "reward", "{:.3f}"),
    ("format", "rewards/format_reward/mean", "{:.3f}"),
    ("tags", "rewards/tag_count_reward/mean", "{:.3f}"),
    ("rm", "rewards/reward_model/mean", "{:+.3f}"),
    # MiniMind-3 (`--upstream minimind3`)
    ("length", "rewards/length/mean", "{:+.3f}"),
    ("thinking", "rewards/thinking_length/mean", "{:+.3f}"),
    ("close", "rewards/think_close_count/mean", "{:+.3f}"),
    ("rep", "rewards/repetition_penalty/mean", "{:+.3f}"),
    ("rm", "rewards/answer_reward_model/mean", "{:+.3f}"),
    # the agent demo (`--agent`): upstream's agent reward's terms, logged by `AgentReward`
    ("calls", "agent_rule_reward/tool_call_fraction", "{:.2f}"),
    ("call_gap", "agent_rule_reward/call_gap", "{:+.3f}"),
    ("gt", "agent_rule_reward/gt_match", "{:.3f}"),
    ("len", "completions/mean_length", "{:.1f}"),
    ("kl", "kl", "{:.4f}"),
)
WINDOW = 10  # the summary compares the mean reward of the first and the last WINDOW logged steps
TERM_KEY = re.compile(r"^rewards/(.+)/mean$")  # TRL's log of one reward function
# (TRL log key, legend label, colour) of the reward terms the curve draws, when logged
CURVE_TERMS = (
    ("rewards/format_reward/mean", "format reward (max 0.5)", "#e6550d"),
    ("rewards/tag_count_reward/mean", "tag reward (max 1.0)", "#31a354"),
    ("rewards/reward_model/mean", "reward model (clipped +-3, 0.4/0.6 blend)", "#756bb1"),
    ("rewards/length/mean", "length (+-0.5)", "#e6550d"),
    ("rewards/thinking_length/mean", "thinking length (-0.5 / +1)", "#31a354"),
    ("rewards/think_close_count/mean", "</think> count (+-0.25)", "#c51b8a"),
    ("rewards/repetition_penalty/mean", "repetition penalty (-0.5..0)", "#636363"),
    ("rewards/answer_reward_model/mean", "reward model on the answer (clipped +-3)", "#756bb1"),
    ("rewards/overlong_punishment/mean", "overlong punishment (-1..0)", "#3182bd"),
    ("agent_rule_reward/tool_call_fraction", "share of rollouts calling a tool", "#e6550d"),
    ("agent_rule_reward/call_gap", "valid call (call_gap, +0.5 / -0.5 per gap)", "#c51b8a"),
    ("agent_rule_reward/gt_match", "tool result stated (gt_match, 0 or 2.5)", "#31a354"),
)


def step_bar(stage: str, total: int) -> tqdm:
    """The progress bar of a stage of `total` steps (on stderr, as the libraries' bars)."""
    return tqdm(total=total, desc=stage, unit="step", dynamic_ncols=True)


class StageProgress(TrainerCallback):
    """A progress bar over a quieted Trainer's steps (the SFT warm starts), with its last logged loss."""

    def __init__(self, stage: str):
        self.stage = stage
        self._bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._bar = step_bar(self.stage, state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        self._bar.update(state.global_step - self._bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._bar is not None and logs and "loss" in logs:
            self._bar.set_postfix(loss=f"{logs['loss']:.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        self._bar.close()


def quieted(trainer):
    """`trainer` without the Trainer's printed log dicts and progress bar: the demo prints its own lines
    (`DemoProgress`), and its SFT warm starts a bar of their steps (`StageProgress`)."""
    from transformers import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    return trainer


class DemoProgress(TrainerCallback):
    """A progress bar and one short line per step in place of the Trainer's printed log dicts, and every logged
    step appended to `metrics.jsonl` (one JSON object per line, flushed, so an interrupted run keeps its lines)."""

    def __init__(self, metrics_path: str | os.PathLike, show_lines: bool = True):
        self.metrics_path = Path(metrics_path)
        self.show_lines = show_lines
        self.records: list[dict] = []
        self._bar = None
        self._file = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._file = self.metrics_path.open("w", encoding="utf-8")
        self._bar = step_bar("GRPO", state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "reward" not in logs:  # the end-of-training summary log has no reward
            return
        record = {"step": state.global_step}
        record.update({key: value for key, value in logs.items() if isinstance(value, (int, float))})
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._bar is not None:
            self._bar.update(state.global_step - self._bar.n)
            if self.show_lines:
                self._bar.write(format_step_line(record, state.max_steps))

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self):
        """Close the bar and the metrics file (also called when training is interrupted)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None


def format_step_line(record: dict, max_steps: int) -> str:
    width = len(str(max_steps))
    parts = [f"step {record['step']:>{width}}/{max_steps}"]
    for label, key, fmt in STEP_FIELDS:
        if key in record:
            parts.append(f"{label} {fmt.format(record[key])}")
    return " | ".join(parts)


def reward_windows(records: list[dict], window: int = WINDOW) -> tuple[int, float, float] | None:
    """(window, mean reward of the first `window` logged steps, of the last `window`); the window shrinks to half
    of a short run. None with fewer than 2 steps."""
    rewards = [record["reward"] for record in records if math.isfinite(record["reward"])]
    if len(rewards) < 2:
        return None
    window = min(window, len(rewards) // 2)
    return window, sum(rewards[:window]) / window, sum(rewards[-window:]) / window


def term_windows(records: list[dict], window: int = WINDOW) -> dict[str, list[float]]:
    """Each logged reward term (`rewards/<name>/mean`, by `<name>`) -> [mean of the first `window` steps, of the last
    `window`]: the window of `reward_windows`."""
    windows = reward_windows(records, window)
    if windows is None:
        return {}
    window = windows[0]
    names = [match.group(1) for key in records[0] if (match := TERM_KEY.match(key))]
    result = {}
    for name in names:
        values = [record.get(f"rewards/{name}/mean") for record in records]
        values = [value for value in values if value is not None and math.isfinite(value)]
        if len(values) >= 2 * window:
            result[name] = [sum(values[:window]) / window, sum(values[-window:]) / window]
    return result


def fit_title(figure, heading, smallest: float = 6.0) -> None:
    """Shrink the title's font until it lies inside the figure (a long title, centred over the axes, ran past the
    right edge)."""
    renderer = figure.canvas.get_renderer()

    def inside() -> bool:
        box, frame = heading.get_window_extent(renderer), figure.bbox
        return box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y1 <= frame.y1

    while not inside() and heading.get_fontsize() > smallest:
        heading.set_fontsize(heading.get_fontsize() - 0.5)
        figure.tight_layout()


def plot_reward_curve(records: list[dict], path: str | os.PathLike, title: str) -> Path | None:
    """The total reward per step, its 10-step mean and each logged reward term, as a small PNG (written atomically).

    Returns None when matplotlib is not installed (it is the optional `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    steps = [record["step"] for record in records]
    rewards = [record["reward"] for record in records]
    figure, axes = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    axes.plot(steps, rewards, color="#9ecae1", linewidth=0.8, label="reward (per step)")
    if len(rewards) >= WINDOW:
        smooth = [sum(rewards[i - WINDOW + 1 : i + 1]) / WINDOW for i in range(WINDOW - 1, len(rewards))]
        axes.plot(steps[WINDOW - 1 :], smooth, color="#08519c", linewidth=2, label=f"reward ({WINDOW}-step mean)")
    for key, label, color in CURVE_TERMS:
        values = [record.get(key) for record in records]
        if all(value is not None for value in values) and len(values) >= WINDOW:
            smooth = [sum(values[i - WINDOW + 1 : i + 1]) / WINDOW for i in range(WINDOW - 1, len(values))]
            axes.plot(steps[WINDOW - 1 :], smooth, color=color, linewidth=1, linestyle="--", label=label)
    axes.set_xlabel("GRPO step")
    with_model = any("rewards/reward_model/mean" in record for record in records)
    minimind3 = any("rewards/answer_reward_model/mean" in record for record in records)
    if any("agent_rule_reward/gt_match" in record for record in records):
        axes.set_ylabel("agent reward (clipped +-3), call share (0-1)")
        low, high = -1.2, 4.2
    elif minimind3:
        axes.set_ylabel("reward (rules +-1.75, RM +-3, overlong -1..0)")
        low, high = -4.9, 5.5
    else:
        axes.set_ylabel("reward (rules max 1.5, reward model +-3)" if with_model else "rule reward (max 1.5)")
        low, high = (-3.2, 4.7) if with_model else (0, 1.75)
    # the total is the recipe's weighted sum (the full demo weighs the rule terms 3): keep all of it in view
    axes.set_ylim(min(low, min(rewards) - 0.3), max(high, max(rewards) + 0.3))
    heading = axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=7.5, ncol=2)
    figure.tight_layout()
    fit_title(figure, heading)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, format="png")
    plt.close(figure)
    os.replace(tmp, path)
    return path


def format_samples(title: str, samples: list[tuple[str, str, float]]) -> list[str]:
    """`(prompt, completion, reward)` triples as summary lines (completion shown with its newlines escaped)."""
    lines = [title]
    for prompt, completion, reward in samples:
        shown = completion.replace("\n", "\\n")
        lines.append(f"  [{reward:.2f}] {prompt}  ->  {shown!s}")
    return lines


def write_summary(path, records, *, rewards: str, reward_funcs, grpo_dataset: str, content, seed: int, reward_model,
                  seconds: float, held_out: tuple[dict, int, bool] = ({}, 0, False), reward_weights=None,
                  warm_start_steps: int = 0):
    """`summary.json`: the reward's first/last 10-step means, each reward term before/after GRPO on the held-out
    prompts (`held_out` = (`held_out.held_out_terms`, how many prompts, whether GRPO trained on them)) and the
    content property's share before/after (`content` = (name, before, after, completions sampled)); returned as a
    dict."""
    windows = reward_windows(records)
    name, before, after, sampled = content
    summary = {
        "rewards": rewards,
        "reward_funcs": reward_funcs,
        "reward_weights": list(reward_weights) if reward_weights is not None else [1.0] * len(reward_funcs),
        "grpo_dataset": grpo_dataset,
        "seed": seed,
        "warm_start_steps": warm_start_steps,
        "steps": len(records),
        "reward_window": windows[0] if windows else None,
        "reward_first10": windows[1] if windows else None,
        "reward_last10": windows[2] if windows else None,
        "reward_gain": windows[2] - windows[1] if windows else None,
        "terms_first_last": term_windows(records),  # each reward term: [first, last] window means
        "content_metric": name,
        "content_before": before,
        "content_after": after,
        "content_gain": after - before,
        "content_completions": sampled,
        "held_out_terms": held_out[0],  # each reward term and the total: [before, after] on the held-out prompts
        "held_out_prompts": held_out[1],
        "held_out_trained_on": held_out[2],
        "reward_model": reward_model,
        "seconds": round(seconds, 1),
    }
    path = Path(path)
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def weighted_names(names, weights) -> str:
    """'3 x format + 3 x tag_count + reward_model': the reward functions with the weights that are not 1."""
    return " + ".join(name if weight == 1.0 else f"{weight:g} x {name}" for name, weight in zip(names, weights))


def _rule_weight(summary: dict) -> str:
    """How the full reward weighs its rule terms against the reward model's, as a prefix of 'rule reward': '' when
    all weigh 1, '3 x ' for the rules at 3 and the reward model at 1, else each weight."""
    weights = dict(zip(summary["reward_funcs"], summary.get("reward_weights") or [1.0] * len(summary["reward_funcs"])))
    rules = {weights.get("format"), weights.get("tag_count")}
    if set(weights.values()) == {1.0}:
        return ""
    if len(rules) == 1 and weights.get("reward_model") == 1.0:
        return f"{rules.pop():g} x "
    return "(weighted " + ", ".join(f"{name} {weight:g}" for name, weight in weights.items()) + ") "


def summary_lines(
    records, grpo_seconds: float, before, after, outputs: list[tuple[str, str]], summary: dict | None = None
) -> list[str]:
    """The closing summary: reward first vs last steps, what the reward means, the content property before/after,
    samples before/after, outputs."""
    lines = [""]
    windows = reward_windows(records)
    kind = summary["rewards"] if summary is not None else "rules"
    full = kind == "full"
    rule_weight = _rule_weight(summary) if full else ""
    if windows is not None:
        window, first, last = windows
        scale = {"full": f"{rule_weight}rules 0-1.5 + reward model -3..3",
                 "minimind3": "MiniMind-3's: rules -1.75..1.75 + reward model -3..3, + the demo's overlong -1..0"}.get(
            kind, "upstream's rule rewards, 0-1.5")
        lines.append(
            f"Reward ({scale}): first {window} steps {first:.3f} -> last {window} steps {last:.3f} "
            f"({last - first:+.3f}) over {len(records)} steps in {grpo_seconds:.0f}s."
        )
    if kind == "minimind3":
        lines.append(
            "Reward = MiniMind-3's (d65ef2c): length (+-0.5: 20..800 characters) + thinking length (+1 for a 20..300 "
            "character thought, else -0.5) + </think> count (+-0.25) - the answer's trigram repetition (<= 0.5) + the "
            "reward model's score of the answer after </think>, clipped to +-3. The reward model prefers answers in "
            "the question's language."
        )
        lines += [
            f"  {name}: {first:+.3f} -> {last:+.3f}" for name, (first, last) in summary["terms_first_last"].items()
        ]
    elif full:
        lines.append(
            f"Reward = {rule_weight}rule reward (0.5 for the exact <think>/<answer> layout + 0.25 per tag used exactly "
            "once) + the reward model's score, clipped to +-3, 0.4 x whole completion + 0.6 x the <answer> text "
            "(upstream's reasoning reward" + (", which weighs the terms alike" if rule_weight else "") + "). The "
            "reward model prefers answers in the question's language."
        )
    else:
        lines.append(
            "Rule reward = 0.5 for the exact <think>/<answer> layout + 0.25 per tag used exactly once (max 1.5). It "
            "scores the layout only; `--rewards full` adds upstream's reward-model term, which scores content."
        )
    if summary is not None:
        lines.append(
            f"Content ({summary['content_metric']}, checked without the reward model on "
            f"{summary['content_completions']} sampled completions for held-out prompts): "
            f"{summary['content_before']:.0%} before GRPO -> {summary['content_after']:.0%} after."
        )
    if summary is not None and summary.get("held_out_terms"):
        lines += held_out_lines(summary["held_out_terms"], summary["content_completions"],
                                summary["held_out_prompts"], summary["held_out_trained_on"])
    lines += format_samples("Before GRPO (the warm-started model), one sample per prompt:", before)
    lines += format_samples("After GRPO (the saved model, read back):", after)
    lines.append("Outputs:")
    lines += [f"  {label}: {where}" for label, where in outputs]
    return lines


__all__ = [
    "DemoProgress",
    "StageProgress",
    "step_bar",
    "quieted",
    "format_samples",
    "format_step_line",
    "plot_reward_curve",
    "reward_windows",
    "term_windows",
    "weighted_names",
    "summary_lines",
    "write_summary",
]
