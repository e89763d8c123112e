"""Tiny models, data, recipes, rewards and probes for the `minimind-trl grpo` tests.

Rewards and callbacks here are referenced from recipes as `grpo_fixtures:name`, so subprocess runs need this
folder on PYTHONPATH (`subprocess_env`). They write what they see into `$GRPO_PROBE_DIR` as JSON lines, one
file per rank, so a test can assert from the outside what happened inside every process.
"""

import json
import os
import signal
import sys
from pathlib import Path

import yaml

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
PROBE_DIR_ENV = "GRPO_PROBE_DIR"
KILL_AT_STEP_ENV = "GRPO_KILL_AT_STEP"

PROMPTS = [
    "What is two plus three?",
    "Name a colour of the sky.",
    "How many days are in a week?",
    "Say hello in French.",
    "What is the capital of France?",
    "Count from one to three.",
    "一加一等于几？",
    "中国的首都是哪里？",
]


def build_tiny_policy(folder: Path, hidden_size: int = 32, num_hidden_layers: int = 2) -> Path:
    """A random MiniMind (h32, 2 layers) with the offline tokenizer, saved like `save_pretrained` users do."""
    from minimind_trl.models.minimind.tiny import save_tiny_minimind

    save_tiny_minimind(folder, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, max_position_embeddings=512)
    return folder


def build_tiny_reward_model(folder: Path) -> Path:
    """A random one-label `LlamaForSequenceClassification` reward model with MiniMind's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    tokenizer = build_minimind_tokenizer()
    config = LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tokenizer),
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(1)
    LlamaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_rlaif(path: Path, prompts=PROMPTS) -> Path:
    """MiniMind's RLAIF jsonl: a user turn and an (unused) assistant turn per line."""
    with open(path, "w", encoding="utf-8") as f:
        for prompt in prompts:
            row = {"conversations": [{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}]}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def tiny_recipe(tmp_path: Path, policy: Path, data: Path, **overrides) -> Path:
    """A recipe for 2 quick GRPO steps: 2 prompts x 4 completions of 8 tokens, fp32, on CPU."""
    recipe = {
        "model_name_or_path": str(policy),
        "dataset_name": str(data),
        "reward_funcs": ["format", "tag_count", "grpo_fixtures:token_reward"],
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "max_prompt_length": 32,
        "learning_rate": 0.01,
        "lr_scheduler_type": "constant",
        "bf16": False,
        "use_cpu": True,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 1,
        "seed": 7,
        "dataloader_num_workers": 0,
    }
    recipe.update(overrides)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


# Holds the output folder's lock (as a running `minimind-trl grpo` or demo does) until its stdin closes.
HOLD_LOCK = """
import sys
from minimind_trl.trainer.outputs.run_lock import output_dir_lock
with output_dir_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def hold_lock(folder):
    """A second process holding `folder`'s run lock (it prints `locked` once it holds it, and lets go at stdin's end)."""
    import subprocess

    return subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=subprocess_env(),
    )  # fmt: skip


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update({key: str(value) for key, value in extra.items()})
    return env


# --------------------------------------------------------------------------- rewards used by recipes


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _probe(kind: str, **record) -> None:
    folder = os.environ.get(PROBE_DIR_ENV)
    if not folder:
        return
    with open(os.path.join(folder, f"{kind}-rank{_rank()}.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def token_reward(prompts, completions, completion_ids, trainer_state=None, **kwargs):
    """A reward that varies between completions of a random model (share of even token ids), so advantages
    are non-zero and every step really moves the weights. Also records prompts, completion lengths and the
    step, and kills its own process hard (SIGKILL) at step `$GRPO_KILL_AT_STEP` when asked."""
    step = trainer_state.global_step if trainer_state is not None else -1
    kill_at = os.environ.get(KILL_AT_STEP_ENV)
    if kill_at is not None and step >= int(kill_at):
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    rewards = [sum(1 for token in ids if token % 2 == 0) / max(len(ids), 1) for ids in completion_ids]
    user_turns = [prompt[-1]["content"] if isinstance(prompt, list) else prompt for prompt in prompts]
    _probe("rewards", step=step, prompts=user_turns, lengths=[len(ids) for ids in completion_ids], rewards=rewards)
    return rewards


# --------------------------------------------------------------------------- callbacks used by recipes

from transformers import TrainerCallback  # noqa: E402


def _local_shard(param):
    """What this rank holds of a parameter: DeepSpeed ZeRO-3's `ds_tensor`, FSDP2's local DTensor shard, or the
    whole parameter."""
    from torch.distributed.tensor import DTensor

    if hasattr(param, "ds_tensor"):
        return param.ds_tensor
    return param.to_local() if isinstance(param, DTensor) else param


class RankProbe(TrainerCallback):
    """Records, on every rank, the process layout and how the policy's parameters are held (DeepSpeed
    ZeRO-3 partitions: each rank's `ds_tensor` holds its shard; FSDP2: each parameter is a sharded DTensor)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import torch.distributed as dist

        params = list(model.parameters())
        partitioned = [p for p in params if _local_shard(p) is not p]
        _probe(
            "layout",
            rank=dist.get_rank() if dist.is_initialized() else 0,
            world_size=dist.get_world_size() if dist.is_initialized() else 1,
            backend=dist.get_backend() if dist.is_initialized() else None,
            distributed_type=str(args.distributed_state.distributed_type),
            zero_stage=args.deepspeed_plugin.zero_stage if args.deepspeed_plugin is not None else None,
            full_numel=sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params),
            local_numel=sum(_local_shard(p).numel() for p in params),
            partitioned_params=len(partitioned),
            trainable=sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in params if p.requires_grad),
            peft=type(model).__name__,
            linear_layers=sorted({type(m).__name__ for m in model.modules() if type(m).__name__.startswith("Linear")}),
        )

    def on_step_end(self, args, state, control, **kwargs):
        _probe("steps", step=state.global_step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        # Under DDP every rank must end with the same weights (gradients are averaged), although each rank
        # generated for different prompts. (Under ZeRO-3 and FSDP this is the checksum of the rank's own shard.)
        import torch

        with torch.no_grad():
            local = [_local_shard(p) for p in model.parameters()]
            _probe("final", checksum=float(sum(t.double().abs().sum() for t in local)), step=state.global_step)


_LEFT_OPEN = {}  # module globals, as a Hub upload pool or a module-level logger keeps them: alive to the process's end


class LeftOpen(TrainerCallback):
    """Leaves, on every rank, a thread pool with an idle worker and a log file open (`left-open-rank<R>.log` in the
    probe folder, one line per step): a launched process must still end, with the log's lines
    (`minimind_trl_cli.process_exit`)."""

    def on_train_begin(self, args, state, control, **kwargs):
        from concurrent.futures import ThreadPoolExecutor

        _LEFT_OPEN["pool"] = ThreadPoolExecutor(2)
        _LEFT_OPEN["pool"].submit(sum, [1, 2]).result()  # its worker now waits for the next task
        folder = os.environ[PROBE_DIR_ENV]
        _LEFT_OPEN["log"] = open(os.path.join(folder, f"left-open-rank{_rank()}.log"), "w", encoding="utf-8")

    def on_step_end(self, args, state, control, **kwargs):
        _LEFT_OPEN["log"].write(f"step {state.global_step}\n")  # buffered: only a close writes it


# --------------------------------------------------------------------------- agent rows, agent rollouts on a random policy

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculate_math", "description": "计算数学表达式",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}  # fmt: skip


def agent_rows(count: int) -> list[dict]:
    """`agent_rl.jsonl` rows as upstream's loader reads them: the system turn carries the tools (a JSON string), the
    conversation ends with the empty assistant turn the rollout fills, `gt` lists the expected results."""
    rows = []
    for i in range(count):
        a, b = 12 + i, 7 + 2 * i
        rows.append({
            "conversations": [
                {"role": "system", "content": "你是一个有用的助手，可以调用工具。", "tools": json.dumps([CALCULATOR])},
                {"role": "user", "content": f"帮我算一下 {a} 乘以 {b} 等于多少"},
                {"role": "assistant", "content": ""},
            ],
            "gt": [str(a * b)],
        })  # fmt: skip
    return rows


def write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return str(path)



STOP_AT_STEP_ENV = "GRPO_STOP_AT_STEP"
SCRIPTED_CALL = '<tool_call>{"name": "calculate_math", "arguments": {"expression": "6*7"}}</tool_call>'


def script_tool_calls(trainer_class):
    """Make agent rollouts multi-turn on a random policy: in a rollout's first turn (no `<tool_response>` in its
    context yet), contexts whose token sum is even get `SCRIPTED_CALL` instead of what the policy sampled (the policy
    still samples, so the random stream is the same); every later turn is the policy's own. Only on rank 0, so with
    two processes one has later turns to generate and the other none. Returns the original method, to restore."""
    original = trainer_class._generate_single_turn

    def generate(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids, logps = original(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        tokenizer = self.processing_class
        call = tokenizer(SCRIPTED_CALL, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids, logps = list(ids), None if logps is None else list(logps)
        for row, context in enumerate(prompt_ids):
            if _rank() == 0 and "<tool_response>" not in tokenizer.decode(context) and sum(context) % 2 == 0:
                ids[row] = list(call)
                if logps is not None:
                    logps[row] = [float("nan")] * len(call)  # not the engine's: the loss falls back to its own
        _probe("agent_turns", contexts=[len(c) for c in prompt_ids], scripted=[i == call for i in ids])
        return ids, logps

    trainer_class._generate_single_turn = generate
    return original


class ScriptedToolCalls(TrainerCallback):
    """`script_tool_calls` for a whole process (subprocess runs name it in `callbacks`)."""

    def __init__(self):
        from minimind_trl.trainer import MiniMindGRPOTrainer

        if not getattr(MiniMindGRPOTrainer, "_tool_calls_scripted", False):
            script_tool_calls(MiniMindGRPOTrainer)
            MiniMindGRPOTrainer._tool_calls_scripted = True


class StopAfterStep(TrainerCallback):
    """Ends training after optimizer step `$GRPO_STOP_AT_STEP` (a run interrupted cleanly, to resume)."""

    def on_step_end(self, args, state, control, **kwargs):
        stop_at = os.environ.get(STOP_AT_STEP_ENV)
        if stop_at is not None and state.global_step >= int(stop_at):
            control.should_training_stop = True


# --------------------------------------------------------------------------- a user's own seams

# A module outside minimind_trl, as a user writes one: a REINFORCE loss reporting a metric of its own, a rank-based
# advantage estimator and a token-mean aggregation. Each records, per rank, that it ran (`$GRPO_PROBE_DIR`).
TOY_SEAMS = '''
import json
import os

import torch


def _ran(seam):
    folder = os.environ.get("GRPO_PROBE_DIR")
    if folder:
        with open(os.path.join(folder, f"seams-rank{os.environ.get('RANK', '0')}.jsonl"), "a") as f:
            f.write(json.dumps({"seam": seam}) + "\\n")


def reinforce(inputs):
    _ran("loss_type")
    loss = -inputs.advantages * inputs.per_token_logps
    return loss, {"toy/logp": inputs.per_token_logps.detach()}


def group_rank(inputs):
    _ran("advantage_estimator")
    grouped = inputs.rewards.view(-1, inputs.num_generations)
    ranks = grouped.argsort(dim=1, stable=True).argsort(dim=1).float()
    return ((ranks - ranks.mean(dim=1, keepdim=True)) / inputs.num_generations).view(-1)


def token_mean(per_token_loss, mask, scale):
    _ran("loss_aggregation")
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / scale.accumulation_steps


def two_arguments(inputs, other):
    return inputs.per_token_logps


NOT_A_FUNCTION = 3
'''
TOY_SEAM_VALUES = {"loss_type": "reinforce", "advantage_estimator": "group_rank", "loss_aggregation": "token_mean"}


def write_toy_seams(folder: Path, module: str) -> dict:
    """`<folder>/<module>.py` holding `TOY_SEAMS`; returns the recipe values naming its three functions."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(TOY_SEAMS, encoding="utf-8")
    return {key: f"{module}:{name}" for key, name in TOY_SEAM_VALUES.items()}


def saved_registries():
    """A context manager restoring the three seams' registries (a resolved `module:function` stays registered)."""
    from contextlib import contextmanager

    from minimind_trl.trainer.algorithm.seam_choice import SEAMS

    @contextmanager
    def restoring():
        saved = [(seam.table, dict(seam.table)) for seam in SEAMS]
        try:
            yield
        finally:
            for table, content in saved:
                table.clear()
                table.update(content)

    return restoring()


# A tool in TRL's `tools=` convention (type hints, Google-style docstring), as TRL's own tests write it.
def multiply(a: int, b: int) -> int:
    """
    Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


def fixed_generation(trainer, tokenizer, length: int, seed: int = 3) -> None:
    """Replace the trainer's sampling by fixed completions of `length` tokens (EOS at varied places, in every third
    row), the same sequence of batches in every trainer built so: two trainers then score identical rollouts."""
    import torch

    generator = torch.Generator().manual_seed(seed)

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completions = torch.randint(3, len(tokenizer), (len(prompt_ids), length), generator=generator).tolist()
        for row, ids in enumerate(completions):
            if row % 3 == 0:
                ids[row % length :] = [tokenizer.eos_token_id]
        return completions, None

    trainer._generate_single_turn = generate


UNEQUAL_PROMPTS = (  # of unequal lengths: all but the longest are left-padded (the prompt-sharing and gpu tests)
    "Name a colour of the sky.",
    "What is the capital of France? Think step by step, then answer.",
    "Say hello.",
    "Count from one to three, slowly, in French.",
)
