"""`minimind-trl demo --agent`: teach a tiny MiniMind-3 on CPU, offline, in minutes, to call `calculate_math` and
state its result, with the package's agent RL (MiniMind-3's `train_agent.py` inside TRL).

    minimind-trl demo --agent [--seed 42] [--output_dir minimind-trl-demo-agent] [--steps N]

1. a MiniMind-3 tokenizer learned from the task's texts (every number up to 999 one token; `<tool_call>` and the
   other tool tags added tokens, as in MiniMind-3's; the system turn's fixed text one token) and a fresh 2-layer
   MiniMind-3 (`agent_task`);
2. a brief SFT warm start with TRL's `SFTTrainer` (`recipes/demo/agent_warm_start.yaml`): the transcript layout,
   each question answered once through the tool and once directly, until the model copies the operands into the
   call and the result into the answer; it then calls on about half its rollouts, and its direct answers are mostly
   wrong;
3. GRPO with `recipes/demo/agent.yaml` through `minimind_trl.grpo` (`parse_recipe` -> `build_trainer` -> `run`):
   `MiniMindGRPOTrainer` with the `AgentRollout` (`rollout: agent`, the real `calculate_math`), upstream's agent
   reward without a reward model (`agent_rule_reward`: a valid call +0.5, the result stated +2.5, an answer
   without a call +0.5 whatever it says), group z-score advantages and CISPO;
4. before and after GRPO, `EVAL_SAMPLES` rollouts for each held-out question (never trained on), judged with the
   package's parser and the real tool: the share with a valid tool call and the share whose final answer states the
   correct result; samples, the reward curve (`reward_curve.png`), `metrics.jsonl` and `summary.json`.

Ctrl-C during GRPO saves the current model into `<output-dir>/interrupted-step-N`.
"""

import argparse
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..agent.reward import TERMS
from . import agent_task as task
from .progress import reward_windows

AGENT_RECIPE = "demo/agent.yaml"
AGENT_WARM_START_RECIPE = "demo/agent_warm_start.yaml"
PROMPTS_FILE = "_agent_prompts.jsonl"  # the GRPO questions, as agent_rl.jsonl rows
HELD_OUT_FILE = "_held_out.jsonl"
WARM_START_DIR = "_warm_start"
SUMMARY_FILE = "summary.json"
TRAIN_QUESTIONS = 1200
HELD_OUT_QUESTIONS = 32
SHOWN_SAMPLES = 4  # held-out questions whose first rollout the report shows, before and after
EVAL_SAMPLES = 4  # rollouts per held-out question, before and after GRPO
REWARD_NAME = "agent_rule_reward"
CURVE_KEYS = ("step", "reward", f"{REWARD_NAME}/tool_call_fraction", f"{REWARD_NAME}/call_gap",
              f"{REWARD_NAME}/gt_match", "kl")


@dataclass
class AgentWarmStartArguments:
    """The keys of `recipes/demo/agent_warm_start.yaml` beyond TRL's `SFTConfig`."""

    target_solved_share: float = field(
        default=0.15,
        metadata={"help": "Stop once this share of the probe's rollouts, sampled as GRPO samples them, call the tool "
                  "and state its result (checked every probe_every steps; max_steps caps it). 0 runs max_steps."},
    )
    target_copied_share: float = field(
        default=0.8,
        metadata={"help": "... and this share of the probe's rollouts that make a valid call state its result: GRPO "
                  "readily teaches calling, copying hardly."},
    )
    min_steps: int = field(default=300, metadata={"help": "No probe before this many SFT steps."})
    probe_every: int = field(default=25, metadata={"help": "SFT steps between two probes."})
    probe_questions: int = field(default=32, metadata={"help": "Training questions the probe samples."})
    probe_rollouts: int = field(default=4, metadata={"help": "Rollouts the probe samples per question."})


@dataclass
class AgentWarmStart:
    """What the warm start did, for the demo's output."""

    steps: int
    solved_share: float | None  # at the last probe; None when no probe ran
    target: float
    copied_share: float | None = None  # at the last probe: of the rollouts with a valid call, those stating its result
    copied_target: float = 0.0

    def reached(self) -> bool | None:
        """Whether the last probe reached both targets (None when no probe ran: the steps were given)."""
        if self.solved_share is None:
            return None
        return self.solved_share >= self.target and self.copied_share >= self.copied_target

    def why_it_stopped(self) -> str:
        """The clause the demo prints after the step count ("" when the steps were given)."""
        if self.solved_share is None:
            return ""
        found = (f"{self.solved_share:.0%} of its sampled rollouts called {task.TOOL} and stated its result, "
                 f"{self.copied_share:.0%} of those that called")
        targets = f"targets {self.target:.0%} and {self.copied_target:.0%}"
        if self.reached():
            return f", until {found} ({targets})"
        return f" (its cap: at the last probe {found}, short of the {targets}; GRPO then has little to build on)"


def warm_start(model, tokenizer, questions, seed: int, steps: int | None, scratch_dir: str, training_args, toolbox,
               max_turns: int) -> AgentWarmStart:
    """The brief SFT of `model` (in place). With `steps` None it runs until `target_solved_share` of the probe's
    rollouts, sampled as GRPO samples them (`training_args`' temperature, top-k and top-p, the real tool), call the
    tool and state its result, and `target_copied_share` of those with a valid call state it (at least `min_steps`,
    at most `max_steps`). What GRPO needs is groups where some rollouts earn the task's reward and some do not: the
    choice to call gives that spread, but a model that calls and then guesses the result guesses the same way in
    every rollout of a group, and GRPO hardly moves it. Copying is learnt in a sudden jump whose step depends on the
    seed, and how often the model samples a call swings from step to step, so neither a fixed length nor a
    teacher-forced copying check finds that point. `steps` runs exactly that many."""
    from transformers import TrainerCallback

    from . import run as demo_run

    sft_args, stop = demo_run.warm_start_settings(AGENT_WARM_START_RECIPE, AgentWarmStartArguments, scratch_dir, seed,
                                                  steps, "target_solved_share")
    rows = task.warm_start_rows(tokenizer, questions)
    probe = questions[: stop.probe_questions]
    probes = []  # (solved share, copied share) per probe

    class StopWhenSolving(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = state.global_step
            if stop.target_solved_share > 0 and step >= stop.min_steps and step % stop.probe_every == 0:
                transcripts = task.sample_transcripts(model, tokenizer, training_args, probe, stop.probe_rollouts, seed,
                                                      toolbox, max_turns)
                model.train()
                verdicts = task.rates(transcripts, probe, stop.probe_rollouts, toolbox)[2]
                probes.append((task.solved_share(verdicts), task.copied_share(verdicts)))
                solved, copied = probes[-1]
                control.should_training_stop = solved >= stop.target_solved_share and copied >= stop.target_copied_share

    trainer = demo_run.run_sft(model, tokenizer, sft_args, rows, StopWhenSolving())
    solved, copied = probes[-1] if probes else (None, None)
    return AgentWarmStart(trainer.state.global_step, solved, stop.target_solved_share, copied, stop.target_copied_share)


def write_rows(path: Path, questions) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for question in questions:
            handle.write(json.dumps(question.row(), ensure_ascii=False) + "\n")
    return path


def judged(model, tokenizer, training_args, questions, seed: int, toolbox, max_turns: int) -> dict:
    """The held-out figures of `model`: `EVAL_SAMPLES` rollouts per question, judged (`agent_task.rates`)."""
    transcripts = task.sample_transcripts(model, tokenizer, training_args, questions, EVAL_SAMPLES, seed, toolbox,
                                          max_turns)
    valid, correct, verdicts = task.rates(transcripts, questions, EVAL_SAMPLES, toolbox)
    return {"valid": valid, "correct": correct, "transcripts": transcripts, "verdicts": verdicts}


def sample_lines(title: str, report: dict, questions) -> list[str]:
    """The first rollout of the first `SHOWN_SAMPLES` held-out questions: question, turns and tool results."""
    lines = [title]
    for index, question in enumerate(questions[:SHOWN_SAMPLES]):
        transcript, verdict = report["transcripts"][index * EVAL_SAMPLES], report["verdicts"][index * EVAL_SAMPLES]
        observations = [m["content"] for m in transcript.messages if m.get("role") == "tool"]
        turns = []
        for number, text in enumerate(transcript.turn_outputs):
            turns.append(text.replace("\n", "\\n"))
            if number < len(observations):
                turns.append(f"[tool: {observations[number]}]")
        mark = ("call" if verdict.valid_call else "no call") + (", correct" if verdict.correct else ", wrong")
        lines.append(f"  [{mark}] {question.messages()[-1]['content']} (= {question.result})  ->  {' | '.join(turns)}")
    return lines


def agent_terms(records: list[dict]) -> dict[str, list[float]]:
    """Each logged agent term (`agent_rule_reward/<term>`) -> [mean of the first window of steps, of the last]."""
    windows = reward_windows(records)
    if windows is None:
        return {}
    window, result = windows[0], {}
    for key in sorted({key for record in records for key in record if key.startswith(REWARD_NAME + "/")}):
        values = [record[key] for record in records if key in record]
        if len(values) >= 2 * window:
            result[key.split("/", 1)[1]] = [sum(values[:window]) / window, sum(values[-window:]) / window]
    return result


def write_summary(path: Path, records: list[dict], before: dict, after: dict, **facts) -> dict:
    """`summary.json`: the held-out shares before/after GRPO, the reward's first/last window, the curve."""
    windows = reward_windows(records)
    summary = {
        "valid_call_rate_before": before["valid"],
        "valid_call_rate_after": after["valid"],
        "correct_answer_rate_before": before["correct"],
        "correct_answer_rate_after": after["correct"],
        "held_out_completions": len(before["verdicts"]),
        **facts,
        "steps": len(records),
        "reward_window": windows[0] if windows else None,
        "reward_first10": windows[1] if windows else None,
        "reward_last10": windows[2] if windows else None,
        "terms_first_last": agent_terms(records),
        "curve": {key: [record.get(key) for record in records] for key in CURVE_KEYS},
    }
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def report_lines(summary: dict, grpo_seconds: float, before: dict, after: dict, held_out) -> list[str]:
    lines = [""]
    if summary["reward_window"]:
        window = summary["reward_window"]
        lines.append(
            f"Reward (upstream's agent reward, no reward model, clipped to +-3): first {window} steps "
            f"{summary['reward_first10']:.3f} -> last {window} steps {summary['reward_last10']:.3f} over "
            f"{summary['steps']} steps in {grpo_seconds:.0f}s."
        )
        terms = summary["terms_first_last"]
        lines += [f"  {name}: {a:+.3f} -> {b:+.3f}" for name, (a, b) in terms.items() if name in TERMS and (a or b)]
        if "tool_call_fraction" in terms:  # logged beside the terms, not one of them
            a, b = terms["tool_call_fraction"]
            lines.append(f"Share of rollouts calling a tool: {a:.0%} -> {b:.0%} (first vs last {window} steps).")
    lines += [
        "Reward = +0.5 for one valid call (-0.5 per missing or extra call) + 2.5 when the answer after the tool "
        "states its result; an answer without a call gets +0.5 for its length, right or wrong.",
        f"Held-out questions ({len(held_out)}, never trained on; {EVAL_SAMPLES} rollouts each, judged with "
        f"minimind_trl.agent's parser and the real {task.TOOL}):",
        f"  valid tool call: {summary['valid_call_rate_before']:.0%} before GRPO -> "
        f"{summary['valid_call_rate_after']:.0%} after",
        f"  correct answer:  {summary['correct_answer_rate_before']:.0%} before GRPO -> "
        f"{summary['correct_answer_rate_after']:.0%} after",
    ]
    lines += sample_lines("Before GRPO (the warm-started model), one rollout per question:", before, held_out)
    lines += sample_lines("After GRPO (the saved model, read back):", after, held_out)
    return lines


def run_agent_demo(args: argparse.Namespace) -> int:
    from ..agent.tools import load_toolbox
    from ..cli.recipe import parse_recipe
    from . import run as demo_run
    from .model import build_model
    from .verdict import agent_verdict, record as record_verdict

    started = time.time()
    output_dir = demo_run.start_run(args)

    held_out = task.make_questions(args.seed + 1, HELD_OUT_QUESTIONS)
    train = task.make_questions(args.seed, TRAIN_QUESTIONS, exclude={q.expression for q in held_out})
    tokenizer = task.build_agent_tokenizer(train)
    spec = task.MODEL
    model = build_model(len(tokenizer), spec, generation="minimind3")
    params = sum(p.numel() for p in model.parameters())
    print(
        f"Model: MiniMind-3 {spec.num_hidden_layers} layers, hidden {spec.hidden_size}, {params / 1e6:.2f}M "
        f"parameters, vocabulary {len(tokenizer)} (numbers 0-{task.LARGEST_NUMBER} one token each), random init, "
        f"seed {args.seed}. Task: {len(train)} arithmetic questions with the {task.TOOL} tool, {len(held_out)} "
        "held out."
    )
    overrides = {
        "model_name_or_path": str(output_dir / WARM_START_DIR),  # written below, before the trainer loads it
        "dataset_name": str(write_rows(output_dir / PROMPTS_FILE, train)),
        "output_dir": str(output_dir),
        "seed": args.seed,
    }
    write_rows(output_dir / HELD_OUT_FILE, held_out)
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    script_args, training_args, model_args, recipe = parse_recipe(AGENT_RECIPE, overrides)
    toolbox = load_toolbox([task.TOOL])
    max_turns = script_args.agent_max_turns

    sft_dir = str(output_dir / "_warm_start.sft")
    warm = warm_start(model, tokenizer, train, args.seed, args.warm_start_steps, sft_dir, training_args, toolbox,
                      max_turns)
    shutil.rmtree(sft_dir, ignore_errors=True)
    print(
        f"Warm start: {warm.steps} SFT steps (TRL SFTTrainer) on transcripts answering each question both through the "
        f"tool and directly{warm.why_it_stopped()} ({time.time() - started:.0f}s so far)."
    )
    warm_model = demo_run.saved_and_read_back(model, tokenizer, output_dir / WARM_START_DIR)
    del model
    before = judged(warm_model, tokenizer, training_args, held_out, args.seed, toolbox, max_turns)
    del warm_model

    trainer, progress, spread = demo_run.build_grpo(script_args, training_args, model_args, recipe, output_dir)
    print(
        f"GRPO: {training_args.max_steps} steps of "
        f"{training_args.per_device_train_batch_size // training_args.num_generations} questions x "
        f"{training_args.num_generations} rollouts (<= {script_args.agent_max_turns} turns of "
        f"<= {training_args.max_completion_length} tokens, the real {task.TOOL}), reward "
        f"{' + '.join(script_args.reward_funcs)}, {training_args.advantage_estimator} advantages, loss "
        f"{training_args.loss_type}, recipe {recipe.path}"
    )
    interrupted, grpo_seconds = demo_run.train_grpo(trainer, progress, script_args, output_dir)
    final_dir = interrupted or output_dir

    title = (f"minimind-trl demo --agent: GRPO on a {params / 1e6:.2f}M-parameter MiniMind-3 on CPU (seed "
             f"{args.seed})\nafter a {warm.steps}-step SFT warm start (each question both with and without the tool)")
    plot, after_model = demo_run.curve_and_saved_model(progress, output_dir, final_dir, title)
    after = judged(after_model, tokenizer, training_args, held_out, args.seed, toolbox, max_turns)
    summary = write_summary(
        output_dir / SUMMARY_FILE, progress.records, before, after, held_out_questions=len(held_out),
        eval_samples=EVAL_SAMPLES, seed=args.seed, warm_start_steps=warm.steps, warm_start_solved_share=warm.solved_share,
        warm_start_copied_share=warm.copied_share,
        reward_funcs=list(script_args.reward_funcs), seconds=round(time.time() - started, 1),
    )
    verdict = agent_verdict(summary, spread.shortfall(training_args.num_generations), warm.steps,
                            training_args.max_steps)
    if not interrupted:
        record_verdict(output_dir / SUMMARY_FILE, summary, verdict)
    lines = report_lines(summary, grpo_seconds, before, after, held_out)
    outputs = demo_run.output_list(trainer, progress, output_dir, final_dir, interrupted, plot, SUMMARY_FILE,
                                   extra=(("held-out questions", str(output_dir / HELD_OUT_FILE)),))
    lines += ["Outputs:"] + [f"  {label}: {where}" for label, where in outputs]
    lines.append(f"Total time {time.time() - started:.0f}s.")
    return demo_run.finish(lines, verdict, interrupted)

