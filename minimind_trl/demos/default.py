"""`minimind-trl demo`: teach a tiny MiniMind the reasoning format and a reward model's preference with GRPO on CPU,
in minutes, offline.

    minimind-trl demo [--rewards full|rules] [--upstream minimind2|minimind3] [--steps 500] [--seed 42]
                      [--output_dir minimind-trl-demo]
    minimind-trl demo --agent [--seed 42] [--output_dir minimind-trl-demo-agent]   (tool calling: `demos.agent`)

The demo is the real pipeline on an embedded default, not a separate trainer:

1. a MiniMind-style tokenizer (byte-level BPE, MiniMind's specials and chat template, the reasoning tags as single
   non-special tokens) learned from the bundled prompts, and a fresh 2-layer MiniMind;
2. a brief SFT warm start with TRL's `SFTTrainer` on bundled format examples (`recipes/demo/warm_start.yaml`
   says how brief and why; `--warm_start_steps 0` skips it);
3. with `--rewards full`: a tiny InternLM2-layout reward model trained on generated preference pairs to prefer
   answers in the question's language (`reward_model`), written to `<output-dir>/_reward_model`;
4. GRPO with `recipes/demo/grpo.yaml` (`--rewards rules`: upstream's two rule rewards) or
   `recipes/demo/grpo_full.yaml` (`--rewards full`: + the reward model, clipped and answer-blended) through
   `minimind_trl.grpo` (`parse_recipe` -> `build_trainer` -> `run`): `MiniMindGRPOTrainer`, upstream's advantages
   and KL;
5. `metrics.jsonl`, `reward_curve.png`, the model as a `save_pretrained` folder and a native `.pth`, a summary
   (reward over the first vs the last 10 steps, completions before vs after, the share of held-out prompts
   answered in the question's language before and after) and the same figures in `summary.json`.

`--upstream minimind3` runs MiniMind-3's GRPO (upstream d65ef2c) instead of the seed's: a tiny MiniMind-3 (q/k
norms) with MiniMind-3's chat template, warm-start examples in its completion layout (`minimind3`), its five
reward terms with the demo's reward model asked MiniMind-3's way, `group_zscore` + `minimind3_cispo` and per-prompt
`thinking_ratio` (`recipes/demo/grpo_minimind3.yaml`).

Ctrl-C during GRPO saves the current model (folder + `.pth`) into `<output-dir>/interrupted-step-N`.
"""

import argparse
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minimind_trl_cli.flags import FlagParser

from .output_dir import DEMO_OUTPUTS, RUN_MARKER, prepare_output_dir  # noqa: F401  (demo.<name> for tests)
from . import run as demo_run
from . import minimind3
from .model import (
    FORMAT_EXAMPLES_FILE,
    PROMPTS_FILE,
    DemoModel,
    build_model,
    build_tokenizer,
    generate_completions,
    read_conversations,
    sample_completions,
)
from .variants import (  # noqa: F401  (the recipes' names are the demo's public constants)
    GRPO_FULL_RECIPE,
    GRPO_MINIMIND3_RECIPE,
    GRPO_RECIPE,
    VARIANTS,
    Variant,
    grpo_recipe,
    reward_kind,
    sampling,
)

REWARD_MODEL_DIR = "_reward_model"
GRPO_PROMPTS_FILE = "_grpo_prompts.jsonl"  # --rewards full: the bundled prompts less the held-out ones
SUMMARY_FILE = "summary.json"
CONTENT_SAMPLES = 4  # completions per held-out prompt for the content share (before and after GRPO)
WARM_START_RECIPE = "demo/warm_start.yaml"
WARM_START_DIR = "_warm_start"


@dataclass
class WarmStartArguments:
    """When the warm start stops (the keys of `recipes/demo/warm_start.yaml` beyond TRL's `SFTConfig`)."""

    target_layout_share: float = field(
        default=0.08,
        metadata={
            "help": "Stop the SFT once this share of sampled completions has the exact <think>/<answer> layout "
            "(checked every probe_every steps; max_steps caps it). 0 runs max_steps."
        },
    )
    min_steps: int = field(
        default=60,
        metadata={
            "help": "No probe before this many SFT steps (~3 passes over the examples): GRPO from an earlier stop, "
            "on a lucky probe, fell into the rule rewards' traps on some seeds."
        },
    )
    probe_every: int = field(default=5, metadata={"help": "SFT steps between two layout probes."})
    probe_prompts: int = field(default=64, metadata={"help": "Bundled prompts sampled once each per probe."})


@dataclass
class WarmStart:
    """What the warm start did, for the demo's output."""

    steps: int
    layout_share: float | None  # at the last probe; None when no probe ran
    target: float
    layout: str = "the exact layout"  # what the probe looked for

    def why_it_stopped(self) -> str:
        """The clause the demo prints after the step count ("" when the steps were given)."""
        if self.layout_share is None:
            return ""
        share, target = f"{self.layout_share:.0%}", f"{self.target:.0%}"
        if self.layout_share >= self.target:
            return f", until {share} of its sampled completions had {self.layout} (target {target})"
        return f" (its cap: the last probe found {share} with {self.layout}, short of the target {target})"


def _recipe_values(name: str) -> dict:
    """A demo recipe's keys and values (the defaults `--help` states, read where they are set)."""
    import yaml

    from ..cli.recipe import resolve_recipe

    return yaml.safe_load(Path(resolve_recipe(name)).read_text(encoding="utf-8"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = FlagParser(
        prog="minimind-trl demo",
        description="Teach a tiny MiniMind the <think>/<answer> format and a reward model's preference with GRPO on "
        "CPU (offline, a few minutes). --upstream minimind3: MiniMind-3's GRPO instead of the seed's.",
    )
    parser.add_argument(
        "--agent",
        action="store_true",
        help="teach a tiny MiniMind-3 to call calculate_math and state its result, with MiniMind-3's agent RL "
        "(recipes/demo/agent.yaml; --rewards, --upstream and --reward_model_steps do not apply)",
    )
    parser.add_argument(
        "--rewards",
        choices=("full", "rules"),
        default=None,
        help="full: upstream's reasoning reward, format + tag_count + a tiny reward model the demo trains to prefer "
        "answers in the question's language (clipped to 3, blended 0.4/0.6); rules: format + tag_count only, the "
        "layout without content (default: full)",
    )
    parser.add_argument(
        "--upstream",
        choices=tuple(VARIANTS),
        default=None,
        help="the upstream GRPO to run: minimind2 (the seed, fea69cf: recipes/demo/grpo_full.yaml or grpo.yaml) or "
        "minimind3 (d65ef2c: a tiny MiniMind-3 with its chat template and <think>...</think> answer layout, its five "
        "reward terms - length, thinking_length, think_close_count, repetition_penalty and the demo's reward model "
        "on the answer - group_zscore advantages, the minimind3_cispo loss and thinking_ratio; "
        "recipes/demo/grpo_minimind3.yaml) (default: minimind2)",
    )
    grpo, agent = (_recipe_values(name) for name in (GRPO_FULL_RECIPE, "demo/agent.yaml"))
    warm, agent_warm = (_recipe_values(name) for name in (WARM_START_RECIPE, "demo/agent_warm_start.yaml"))
    parser.add_argument("--steps", type=int, default=None,
                        help=f"GRPO steps (default: the recipe's max_steps: {grpo['max_steps']}; with --agent "
                        f"{agent['max_steps']}, recipes/demo/agent.yaml's)")
    parser.add_argument("--seed", type=int, default=42,
                        help="seed for the model, the warm start and GRPO (default: %(default)s)")
    parser.add_argument("--output_dir", default=None,
                        help="where outputs go (default: minimind-trl-demo, with --agent minimind-trl-demo-agent)")
    parser.add_argument(
        "--warm_start_steps",
        type=int,
        default=None,
        help=f"SFT steps before GRPO (default: until {round(100 * warm['target_layout_share'])}%% of sampled completions have "
        f"the exact layout, at least {warm['min_steps']} and at most {warm['max_steps']}, as "
        f"recipes/demo/warm_start.yaml says; with --agent until {round(100 * agent_warm['target_solved_share'])}%% of "
        f"the probe's sampled rollouts call the tool and state its result and "
        f"{round(100 * agent_warm['target_copied_share'])}%% of those that call do, at least {agent_warm['min_steps']} and at "
        f"most {agent_warm['max_steps']}, as recipes/demo/agent_warm_start.yaml says; 0 skips)",
    )
    parser.add_argument(
        "--reward_model_steps",
        type=int,
        default=None,
        help="--rewards full: Bradley-Terry steps (32 pairs each) training the demo's reward model (default: 200)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: %(default)s; at this model size more threads mostly add overhead)",
    )
    args = parser.parse_args(argv)
    if args.agent:
        given = [f"--{name}" for name in ("rewards", "upstream", "reward_model_steps")
                 if getattr(args, name) is not None]
        if given:
            parser.error(f"{', '.join(given)}: not used with --agent (its reward is recipes/demo/agent.yaml's)")
    defaults = {"rewards": "full", "upstream": "minimind2", "reward_model_steps": 200,
                "output_dir": "minimind-trl-demo-agent" if args.agent else "minimind-trl-demo"}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.upstream == "minimind3" and args.rewards == "rules":
        parser.error("--rewards rules is the seed's rule-only reward; --upstream minimind3 runs MiniMind-3's whole "
                     "reward")
    for name in ("steps", "warm_start_steps", "threads", "reward_model_steps"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "warm_start_steps" else 1):
            parser.error(f"--{name} must be {'>= 0' if name == 'warm_start_steps' else '>= 1'}")
    return args


# --------------------------------------------------------------------------- warm start


def layout_share(model, tokenizer, training_args, prompts, variant: Variant = VARIANTS["minimind2"]) -> float:
    """Share of `prompts` whose completion, sampled as GRPO samples, has the variant's layout (the seed's: the
    exact layout of its format reward; MiniMind-3's: one `</think>` then an answer, after an open thought)."""
    import torch

    with torch.random.fork_rng():  # probing must not move the training's random stream
        texts = generate_completions(model, tokenizer, training_args, prompts, 0, variant.sample_kwargs)
    return sum(variant.has_layout(text) for text in texts) / len(texts)


def sft_rows(variant: Variant, seed: int, thinking_ratio: float | None) -> list[dict]:
    """The warm start's TRL SFT rows: the bundled format examples as they are (the seed's layout) or in MiniMind-3's."""
    conversations = read_conversations(FORMAT_EXAMPLES_FILE)
    if variant.generation == "minimind3":
        return minimind3.warm_start_rows(conversations, thinking_ratio, seed)
    return [{"prompt": turns[:-1], "completion": turns[-1:]} for turns in conversations]


def warm_start(model, tokenizer, seed: int, steps: int | None, scratch_dir: str, grpo_args,
               variant: Variant = VARIANTS["minimind2"], thinking_ratio: float | None = None) -> WarmStart:
    """A brief SFT of `model` on the bundled format examples (in place; in MiniMind-3's layout for that variant,
    opening the thought in `thinking_ratio` of the prompts as GRPO will).

    With `steps` None it runs until `target_layout_share` of sampled completions have the exact layout, at least
    the recipe's `min_steps` and at most its `max_steps`: GRPO then starts, on every seed, from a policy that
    sometimes samples the layout (as the seed starts from an SFT'd reasoning model) but mostly does not. `steps`
    runs exactly that many."""
    from transformers import TrainerCallback

    sft_args, stop_args = demo_run.warm_start_settings(WARM_START_RECIPE, WarmStartArguments, scratch_dir, seed, steps,
                                                       "target_layout_share")
    probe_prompts = [turns[0]["content"] for turns in read_conversations(PROMPTS_FILE)][: stop_args.probe_prompts]
    shares = []

    class StopAtLayoutShare(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            probing = stop_args.target_layout_share > 0 and state.global_step >= stop_args.min_steps
            if not probing or state.global_step % stop_args.probe_every:
                return
            shares.append(layout_share(model, tokenizer, grpo_args, probe_prompts, variant))
            model.train()
            if shares[-1] >= stop_args.target_layout_share:
                control.should_training_stop = True

    trainer = demo_run.run_sft(model, tokenizer, sft_args, sft_rows(variant, seed, thinking_ratio),
                               StopAtLayoutShare())
    return WarmStart(
        trainer.state.global_step, shares[-1] if shares else None, stop_args.target_layout_share, variant.layout_name
    )


# --------------------------------------------------------------------------- the run


def run_demo(args: argparse.Namespace) -> int:
    from .held_out import held_out_terms, sample_held_out
    from .progress import summary_lines, weighted_names, write_summary
    from .reward_model import CONTENT_METRIC, bundled_texts, prepare_full_reward
    from .verdict import grpo_verdict, record as record_verdict
    from ..cli.recipe import parse_recipe

    started = time.time()
    output_dir = demo_run.start_run(args)
    variant = VARIANTS[args.upstream]

    tokenizer = build_tokenizer(variant.generation)
    model = build_model(len(tokenizer), generation=variant.generation)
    params = sum(p.numel() for p in model.parameters())
    spec = DemoModel()
    print(
        f"Model: {variant.label} {spec.num_hidden_layers} layers, hidden {spec.hidden_size}, {params / 1e6:.2f}M "
        f"parameters, vocabulary {len(tokenizer)} (tokenizer learned from the bundled prompts), random init, seed "
        f"{args.seed}."
    )
    overrides = {
        "model_name_or_path": str(output_dir / WARM_START_DIR),  # written below, before the trainer loads it
        "dataset_name": str(PROMPTS_FILE),
        "output_dir": str(output_dir),
        "seed": args.seed,
    }
    held_out = bundled_texts()[1]
    reward_model_report = None
    if args.rewards == "full":  # GRPO and the reward model see the prompts the content check does not use
        reward_model_report = prepare_full_reward(
            output_dir / REWARD_MODEL_DIR, output_dir / GRPO_PROMPTS_FILE, args.seed, args.reward_model_steps,
            variant.pairs, variant.reward_model_asked,
        )
        overrides.update(
            dataset_name=str(output_dir / GRPO_PROMPTS_FILE),
            reward_model_name_or_path=str(output_dir / REWARD_MODEL_DIR),
        )
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    script_args, training_args, model_args, recipe = parse_recipe(grpo_recipe(args), overrides)

    warm_steps = 0
    if args.warm_start_steps != 0:
        sft_dir = str(output_dir / "_warm_start.sft")
        warm = warm_start(model, tokenizer, args.seed, args.warm_start_steps, sft_dir, training_args, variant,
                          script_args.thinking_ratio)
        shutil.rmtree(sft_dir, ignore_errors=True)
        warm_steps = warm.steps
        print(
            f"Warm start: {warm_steps} SFT steps (TRL SFTTrainer) on {FORMAT_EXAMPLES_FILE.name}"
            f"{warm.why_it_stopped()}; {variant.warm_start_note} ({time.time() - started:.0f}s so far)."
        )
    else:
        print("Warm start: none (--warm_start_steps 0); GRPO starts from random weights.")
    warm_model = demo_run.saved_and_read_back(model, tokenizer, output_dir / WARM_START_DIR)
    del model
    before = sample_completions(warm_model, tokenizer, training_args, seed=args.seed, **sampling(variant))
    held_before = sample_held_out(warm_model, tokenizer, training_args, held_out, CONTENT_SAMPLES, args.seed,
                                  variant.sample_kwargs)
    del warm_model

    trainer, progress, spread = demo_run.build_grpo(script_args, training_args, model_args, recipe, output_dir)
    print(
        f"GRPO: {training_args.max_steps} steps of {training_args.per_device_train_batch_size // training_args.num_generations}"
        f" prompts x {training_args.num_generations} completions (<= {training_args.max_completion_length} tokens), "
        f"rewards {weighted_names(script_args.reward_funcs, trainer.reward_weights.tolist())} "
        f"({variant.reward_scale(args.rewards)}), "
        f"{training_args.advantage_estimator} advantages, loss {training_args.loss_type}, recipe {recipe.path}"
    )
    interrupted, grpo_seconds = demo_run.train_grpo(trainer, progress, script_args, output_dir)
    final_dir = interrupted or output_dir

    title = f"minimind-trl demo: GRPO on a {params / 1e6:.2f}M-parameter {variant.label} on CPU (seed {args.seed})\n"
    title += (
        f"after a {warm_steps}-step SFT warm start" if warm_steps else "from random weights, no warm start"
    )
    plot, after_model = demo_run.curve_and_saved_model(progress, output_dir, final_dir, title)
    after = sample_completions(after_model, tokenizer, training_args, seed=args.seed, **sampling(variant))
    held_after = sample_held_out(after_model, tokenizer, training_args, held_out, CONTENT_SAMPLES, args.seed,
                                 variant.sample_kwargs)
    summary = write_summary(
        output_dir / SUMMARY_FILE,
        progress.records,
        rewards=reward_kind(args),
        reward_funcs=list(script_args.reward_funcs),
        grpo_dataset=script_args.dataset_name,
        content=(CONTENT_METRIC, held_before.share(variant.in_language), held_after.share(variant.in_language),
                 len(held_out) * CONTENT_SAMPLES),
        seed=args.seed,
        reward_model=reward_model_report,
        held_out=(held_out_terms(trainer, held_before, held_after), len(held_out), args.rewards == "rules"),
        reward_weights=trainer.reward_weights.tolist(),
        warm_start_steps=warm_steps,
        seconds=time.time() - started,
    )
    verdict = grpo_verdict(summary, spread.shortfall(training_args.num_generations), warm_steps,
                           training_args.max_steps)
    if not interrupted:
        record_verdict(output_dir / SUMMARY_FILE, summary, verdict)
    outputs = demo_run.output_list(trainer, progress, output_dir, final_dir, interrupted, plot, SUMMARY_FILE)
    lines = summary_lines(progress.records, grpo_seconds, before, after, outputs, summary)
    lines.append(f"Total time {time.time() - started:.0f}s.")
    return demo_run.finish(lines, verdict, interrupted)


def main(argv: list[str] | None = None) -> int:
    """`minimind-trl demo`; user errors raise `MiniMindTRLError` (the `minimind-trl` command reports them)."""
    args = parse_args(argv)
    try:
        if args.agent:
            from .agent import run_agent_demo

            return run_agent_demo(args)
        return run_demo(args)
    except KeyboardInterrupt:  # outside GRPO training (setup, warm start, summary): nothing half-trained to keep
        print(f"minimind-trl demo: interrupted; whatever was complete is in {args.output_dir}", file=sys.stderr)
        return 130

