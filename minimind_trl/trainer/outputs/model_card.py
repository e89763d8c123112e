"""The model card of a MiniMind GRPO run: what a reader needs on top of TRL's generic card.

TRL writes `README.md` in `output_dir` at every checkpoint and before a push. `RunCard` holds the base model, the
recipe, the reward functions and their weights, and `render_run_section` adds the final metrics and how far the
settings follow upstream MiniMind's `train_grpo.py`; `extend_model_card` inserts that section into TRL's card and
replaces TRL's Quick start (a `pipeline` on a placeholder, which fails for MiniMind) by one that runs as written.
`MiniMindGRPOTrainer.create_model_card` does this for every run, from Python or the CLI. An export keeps the section
(`run_record`) in its own card.
"""

import json
import os
from dataclasses import dataclass, field

from ...rewards.registry import reward_model_rewards
from ...generations import SCRIPT, TRAINING, UPSTREAMS, compare, format_value, get_generation, same_value
from ..algorithm.seam_choice import seam_rows

# (setting, upstream flag, upstream's value) of every config field the seed (the minimind2 record, whose defaults the
# config keeps) sets; tests check them against MiniMindGRPOConfig's defaults and the seed recipes.
UPSTREAM_SETTINGS = tuple((row.name, row.flag, row.value) for row in get_generation(None).rows() if row.kind == TRAINING)
UPSTREAM_SCRIPT_SETTINGS = tuple((row.name, row.flag, row.value) for row in get_generation(None).rows() if row.kind == SCRIPT)
CARD_SECTION_TITLE = "## MiniMind GRPO run"
TRL_SECTION_AFTER = "\n## Training procedure"  # the section of TRL's card the run section goes before
LOADING_TITLE = "### Loading"


@dataclass
class RunCard:
    """What the model card says about a run (`describe_run` fills it: the run plan for the CLI, the trainer for
    Python)."""

    base_model: str
    recipe: str | None = None
    recipe_text: str | None = None
    overrides: list[str] = field(default_factory=list)
    reward_funcs: list[str] = field(default_factory=list)
    reward_weights: list[float] = field(default_factory=list)
    reward_model: str | None = None
    dataset: str | None = None
    eval_dataset: str | None = None  # where the held-out prompts come from (None: the run did not evaluate)
    peft: dict | None = None  # the adapter: its PEFT method and main settings (`peft_summary`)
    settings: list[tuple] = field(default_factory=list)  # (setting, this run, upstream, upstream flag)
    upstream: str = get_generation(None).title  # the generation `settings` compares against
    functions: list[tuple] = field(default_factory=list)  # (config key, name, function): `seam_choice.seam_rows`


def upstream_settings(training_args, script_args=None) -> list[tuple]:
    """(setting, this run's value, upstream's value, upstream flag) for every setting of the upstream generation the
    run follows (`training_args.upstream`, by default the seed's); the rewards' rows need the CLI's script
    arguments (`reward_funcs`, `reasoning`, `reward_model_clip`, ...)."""
    generation = get_generation(getattr(training_args, "upstream", None))
    return [(row.name, row.run_value, row.upstream_value, row.flag) for row in compare(generation, training_args, script_args)]


# The settings a card shows per PEFT method family (any others: the method alone)
_PEFT_CARD_FIELDS = {"r": "r", "lora_alpha": "alpha", "target_modules": "targets", "num_virtual_tokens": "virtual_tokens"}


def peft_summary(peft_config) -> dict | None:
    """What the card says about a PEFT adapter: its method (`LORA`, `PROMPT_TUNING`, ...) and those of its rank,
    alpha, target modules and virtual tokens it has; any PEFT config works (prompt learning has no rank)."""
    if peft_config is None:
        return None
    method = getattr(peft_config, "peft_type", None)
    summary = {"method": getattr(method, "value", method) or type(peft_config).__name__}
    for name, shown in _PEFT_CARD_FIELDS.items():
        value = getattr(peft_config, name, None)
        if value is not None:
            summary[shown] = sorted(value) if isinstance(value, (set, frozenset)) else value
    return summary


def upstream_title(training_args) -> str:
    return get_generation(getattr(training_args, "upstream", None)).title


def describe_run(base_model: str, args, script_args=None, peft_config=None, **described) -> RunCard:
    """The run's card in one go: the function each seam runs, then every setting against the upstream generation
    the run follows (`args.upstream`, by default the seed's; the rewards' rows need the CLI's `script_args`).
    `described` are `RunCard`'s other fields (recipe, rewards, data)."""
    functions = seam_rows(args)
    generation = get_generation(getattr(args, "upstream", None))
    rows = compare(generation, args, script_args)
    return RunCard(
        base_model=base_model,
        peft=peft_summary(peft_config),
        settings=[(row.name, row.run_value, row.upstream_value, row.flag) for row in rows],
        upstream=generation.title,
        functions=functions,
        **described,
    )


CARD_METRICS = (
    "step",
    "epoch",
    "reward",
    "reward_std",
    "kl",
    "loss",
    "completions/mean_length",
    "entropy",
    "learning_rate",
)


def final_metrics(log_history: list[dict]) -> dict:
    """The last logged training metrics (step, rewards, KL, loss, length, ...) and the run summary."""
    last = next((entry for entry in reversed(log_history) if "reward" in entry), {})
    metrics = {key: last[key] for key in CARD_METRICS if key in last}
    metrics.update({key: value for key, value in last.items() if key.startswith("rewards/") and key.endswith("/mean")})
    summary = next((entry for entry in reversed(log_history) if "train_runtime" in entry), {})
    for key in ("train_runtime", "train_loss", "total_flos"):
        if key in summary:
            metrics[key] = summary[key]
    return metrics


def final_eval_metrics(log_history: list[dict]) -> dict:
    """The last evaluation's held-out rewards as TRL logs them (`eval_reward`, `eval_reward_std`, each reward
    function's `eval_rewards/<name>/mean`, the terms a reward logs itself such as `eval_agent_reward/<term>`, and
    those of named eval sets, `eval_<set>_reward`) and the step it ran at."""
    last = next((entry for entry in reversed(log_history) if any(map(_is_eval_reward, entry))), {})
    metrics = {key: value for key, value in last.items() if _is_eval_reward(key)}
    return {"step": last["step"], **metrics} if metrics and "step" in last else metrics


def _is_eval_reward(key: str) -> bool:
    head = key.split("/")[0]
    rewards = head.endswith(("_reward", "_reward_std", "_rewards"))  # the totals, per function, a reward's own terms
    return key.startswith("eval_") and not key.endswith("/std") and rewards


def _source(title: str) -> str:
    """What the parity table compares with: MiniMind's `train_grpo.py`, or TRL's `GRPOConfig` defaults."""
    return next((record.source for record in UPSTREAMS.values() if record.title == title), get_generation(None).source)


def _metrics_table(title: str, metrics: dict, when_empty: str) -> list[str]:
    lines = ["", f"### {title}", ""]
    if not metrics:
        return lines + [when_empty]
    rows = [f"| {key} | {format_value(value)} |" for key, value in metrics.items()]
    return lines + ["| metric | value |", "|---|---|"] + rows


def python_string(value: str) -> str:
    """`value` as a double-quoted Python string literal (JSON's escapes are Python's), for the card's code."""
    return json.dumps(value, ensure_ascii=False)


def render_run_section(card: RunCard, log_history: list[dict], model_location: str | None) -> str:
    """The card's MiniMind section; `model_location` is where the model loads from, as its code blocks name it (the
    Hub id of a pushed run, else the output folder as the run named it)."""
    lines = [CARD_SECTION_TITLE, ""]
    lines.append(f"- **Base model:** `{card.base_model}`")
    if card.dataset:
        lines.append(f"- **Data:** `{card.dataset}`")
    if card.eval_dataset:
        lines.append(f"- **Held-out prompts:** `{card.eval_dataset}`")
    if card.recipe:
        lines.append(
            f"- **Recipe:** `{card.recipe}`" + (f" with `{' '.join(card.overrides)}`" if card.overrides else "")
        )
    if card.peft:
        lines.append(f"- **PEFT:** {', '.join(f'{k}={v}' for k, v in card.peft.items())}")
    lines += ["", "### Reward functions", "", "| reward | weight |", "|---|---|"]
    weights = card.reward_weights or [1.0] * len(card.reward_funcs)
    scoring_with_model = reward_model_rewards()
    for name, weight in zip(card.reward_funcs, weights):
        shown = f"{name} (`{card.reward_model}`)" if name in scoring_with_model and card.reward_model else name
        lines.append(f"| {shown} | {format_value(float(weight))} |")

    if card.functions:
        lines += ["", "### Advantages and loss", "", "| setting | name | function |", "|---|---|---|"]
        lines += [f"| {key} | `{name}` | `{function}` |" for key, name, function in card.functions]

    lines += _metrics_table("Final metrics", final_metrics(log_history), "No metrics were logged.")
    evaluated = final_eval_metrics(log_history)
    if card.eval_dataset or evaluated:
        lines += _metrics_table("Held-out rewards (the last evaluation)", evaluated, "No evaluation ran.")

    lines += [
        "",
        f"### Settings against {_source(card.upstream)} (upstream parity: {card.upstream})",
        "",
        "| setting | this run | upstream | upstream flag | same |",
        "|---|---|---|---|---|",
    ]
    for name, value, upstream_value, flag in card.settings:
        lines.append(
            f"| {name} | {format_value(value)} | {format_value(upstream_value)} | {flag} | {'yes' if same_value(value, upstream_value) else 'no'} |"
        )

    if card.recipe_text:
        lines += [
            "",
            "<details><summary>Recipe</summary>",
            "",
            "```yaml",
            card.recipe_text.rstrip(),
            "```",
            "",
            "</details>",
        ]
    repo = model_location or "path/to/this/folder"
    lines += [
        "",
        LOADING_TITLE,
        "",
        "With minimind-trl installed, `import minimind_trl` registers MiniMind with transformers' Auto classes (as in",
        "the Quick start). Without it, the modeling code shipped with the model loads with `trust_remote_code=True`:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = AutoModelForCausalLM.from_pretrained({python_string(repo)}, trust_remote_code=True)",
        f"tokenizer = AutoTokenizer.from_pretrained({python_string(repo)}, trust_remote_code=True)",
        "```",
    ]
    return "\n".join(lines) + "\n"


def run_record(card_text: str) -> str | None:
    """A training card's run section without its Loading part (which names the training folder): what an export
    of the model keeps of how it was trained. None when the card has no run section."""
    start = card_text.find(CARD_SECTION_TITLE)
    if start == -1:
        return None
    end = card_text.find(TRL_SECTION_AFTER, start)
    section = card_text[start : end if end != -1 else len(card_text)]
    return section.split("\n" + LOADING_TITLE, 1)[0].rstrip() + "\n"


QUICK_START_TITLE = "## Quick start"
QUICK_START_QUESTION = (  # TRL's template's
    "If you had a time machine, but could only go to the past or the future once and never return, which would you "
    "choose and why?"
)


def quick_start(model_location: str) -> str:
    """The card's Quick start: TRL's `pipeline` example, which runs as written on a MiniMind once `minimind_trl` is
    imported (TRL's own has no import and a placeholder path, so it fails for MiniMind)."""
    return "\n".join([
        QUICK_START_TITLE,
        "",
        "```python",
        "import minimind_trl  # registers MiniMind with transformers (without minimind-trl: see Loading below)",
        "from transformers import pipeline",
        "",
        f"question = {python_string(QUICK_START_QUESTION)}",
        f'generator = pipeline("text-generation", model={python_string(model_location)})',
        'output = generator([{"role": "user", "content": question}], max_new_tokens=128, return_full_text=False)[0]',
        'print(output["generated_text"])',
        "```",
        "",
    ])  # fmt: skip


def _replace_section(text: str, title: str, body: str) -> str:
    """`text` with its `## title` section (up to the next `## `) replaced by `body`; unchanged without one."""
    start = text.find(title + "\n")
    if start == -1:
        return text
    end = text.find("\n## ", start + len(title))
    return text[:start] + body + (text[end + 1 :] if end != -1 else "")


def extend_model_card(readme_path: str, section: str, base_model: str, model_location: str) -> None:
    """Insert the run section into TRL's card (before its "Training procedure"), replacing an older one, and TRL's
    Quick start by `quick_start` for the model at `model_location`."""
    with open(readme_path, encoding="utf-8") as f:
        text = f.read()
    if CARD_SECTION_TITLE in text:  # a card written at an earlier checkpoint
        start = text.index(CARD_SECTION_TITLE)
        end = text.find(TRL_SECTION_AFTER, start)
        text = text[:start] + (text[end + 1 :] if end != -1 else "")
    # TRL links the base model only when it is a Hub id; say what it was otherwise.
    text = text.replace("[None](https://huggingface.co/None)", f"`{base_model}`")
    text = _replace_section(text, QUICK_START_TITLE, quick_start(model_location))
    anchor = text.find("## Training procedure")
    text = text[:anchor] + section + "\n" + text[anchor:] if anchor != -1 else text.rstrip() + "\n\n" + section
    tmp = f"{readme_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, readme_path)


__all__ = [
    "CARD_SECTION_TITLE",
    "RunCard",
    "UPSTREAM_SETTINGS",
    "describe_run",
    "extend_model_card",
    "quick_start",
    "run_record",
    "final_eval_metrics",
    "final_metrics",
    "peft_summary",
    "render_run_section",
    "upstream_settings",
    "upstream_title",
]
