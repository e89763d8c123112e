"""`accelerate launch -m minimind_trl.grpo` for real on CPU (gloo): DDP and DeepSpeed ZeRO-3 on 2 processes,
ZeRO-2 + LoRA on 1, a 2-process checkpoint resumed on 1 process, and a batch ZeRO-3 cannot split; and a
2-process DDP run whose groups span both processes, replayed in one process.

Every rank writes what it sees (process layout, parameter partitioning, prompts, completion lengths, steps,
final weights) into JSON lines through `grpo_fixtures:RankProbe` / `grpo_fixtures:token_reward`; the tests
assert on those files. These are the slow tests of the suite (`-m slow`); DeepSpeed JIT-builds its CPU
communication op with ninja on first use (cached in ~/.cache/torch_extensions afterwards).
"""

import json
import os
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import free_port
from grpo_fixtures import (
    PROBE_DIR_ENV,
    REPO_ROOT,
    build_tiny_policy,
    build_tiny_reward_model,
    subprocess_env,
    tiny_recipe,
    write_rlaif,
    write_toy_seams,
)
from safetensors.torch import load_file
from trainer_fixtures import ACCELERATE_CONFIGS

pytestmark = pytest.mark.slow

def launch(
    config: str, num_processes: int, recipe: Path, probe_dir: Path, *args: str, pythonpath: Path | None = None,
    callbacks: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file recipes/accelerate/<config>.yaml -m minimind_trl.grpo --config recipe`,
    with the GPU recipe's process count and precision overridden for this CPU machine (`pythonpath`: a folder of
    the user's own modules, put first on PYTHONPATH; `callbacks`: more than `RankProbe`)."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / f"{config}.yaml"),
        "--num_processes", str(num_processes),
        "--mixed_precision", "no",
        "--main_process_port", str(free_port()),
        "-m", "minimind_trl.grpo",
        "--config", str(recipe),
        "--callbacks", "grpo_fixtures:RankProbe", *callbacks,
        *args,
    ]  # fmt: skip
    env = subprocess_env(**{PROBE_DIR_ENV: probe_dir, "OMP_NUM_THREADS": 1})
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env["PYTHONPATH"]])
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def records(probe_dir: Path, kind: str, rank: int) -> list[dict]:
    path = probe_dir / f"{kind}-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distributed")
    return SimpleNamespace(
        root=root,
        policy=build_tiny_policy(root / "policy"),
        reward_model=build_tiny_reward_model(root / "reward_model"),
        data=write_rlaif(root / "rlaif.jsonl"),
    )


def run_dir(setup, name: str) -> Path:
    folder = setup.root / name
    (folder / "probe").mkdir(parents=True)
    return folder


@pytest.fixture(scope="module")
def ddp(setup):
    """2 processes x 4 completions (1 prompt each) = the 8-completion global batch, checkpoint at every step."""
    folder = run_dir(setup, "ddp")
    recipe = tiny_recipe(
        folder, setup.policy, setup.data, per_device_train_batch_size=4, save_strategy="steps", save_steps=1
    )
    result = launch("ddp", 2, recipe, folder / "probe", callbacks=("grpo_fixtures:LeftOpen",))
    assert result.returncode == 0, result.stderr[-4000:]
    return SimpleNamespace(folder=folder, probe=folder / "probe", out=folder / "out", recipe=recipe)


def test_ddp_two_processes(ddp):
    layouts = [records(ddp.probe, "layout", rank)[0] for rank in (0, 1)]
    for rank, layout in enumerate(layouts):
        assert layout["rank"] == rank and layout["world_size"] == 2 and layout["backend"] == "gloo"
        assert layout["distributed_type"] == "DistributedType.MULTI_CPU" and layout["partitioned_params"] == 0
        assert layout["local_numel"] == layout["full_numel"]  # DDP: every rank holds the whole model
    for rank in (0, 1):
        assert [row["step"] for row in records(ddp.probe, "steps", rank)] == [1, 2]
        rows = records(ddp.probe, "rewards", rank)
        assert [len(row["prompts"]) for row in rows] == [4, 4] and all(len(set(row["prompts"])) == 1 for row in rows)
    # The ranks generated for different prompts but end with identical weights: gradients were averaged.
    prompts = [[row["prompts"][0] for row in records(ddp.probe, "rewards", rank)] for rank in (0, 1)]
    assert all(a != b for a, b in zip(prompts[0], prompts[1]))
    finals = [records(ddp.probe, "final", rank)[0]["checksum"] for rank in (0, 1)]
    assert finals[0] == pytest.approx(finals[1], rel=1e-12)
    for step in (1, 2):
        checkpoint = ddp.out / f"checkpoint-{step}"
        assert (checkpoint / "rng_state_0.pth").is_file() and (checkpoint / "rng_state_1.pth").is_file()
    # A callback left a thread pool and a log file open in every rank: the launch ended (it hung until killed), and
    # the log kept its lines (they were lost with the interpreter's finalization skipped).
    for rank in (0, 1):
        assert (ddp.probe / f"left-open-rank{rank}.log").read_text() == "step 1\nstep 2\n"


def test_a_loss_estimator_and_aggregation_of_a_module_outside_the_package_run_in_every_process(setup):
    """Issue 35: `module:function` seams named in a recipe are imported by every process's config."""
    folder = run_dir(setup, "seams")
    values = write_toy_seams(folder / "user_code", "toy_seams_launched")
    recipe = tiny_recipe(folder, setup.policy, setup.data, per_device_train_batch_size=4, **values)
    result = launch("ddp", 2, recipe, folder / "probe", pythonpath=folder / "user_code")
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        ran = Counter(row["seam"] for row in records(folder / "probe", "seams", rank))
        assert ran["advantage_estimator"] == 2 and ran["loss_type"] >= 2 and ran["loss_aggregation"] >= 2, ran
        assert [row["step"] for row in records(folder / "probe", "steps", rank)] == [1, 2]
    assert f"| loss_type | `{values['loss_type']}` |" in (folder / "out" / "README.md").read_text()


def test_two_process_checkpoint_resumes_on_one_process(ddp, setup, capsys):
    """Upstream's resume handled a changed world size; here the global batch stays 8 completions, so the single
    process continues with exactly the prompts the two processes would have drawn at step 2."""
    from minimind_trl.grpo import main

    folder = run_dir(setup, "resumed-on-one")
    common = ["--config", str(ddp.recipe), "--output_dir", str(folder / "out")]
    checkpoint = str(ddp.out / "checkpoint-1")

    assert main([*common, "--resume_from_checkpoint", checkpoint]) == 2  # per-device batch unchanged: refused
    assert "set per_device_train_batch_size=8" in capsys.readouterr().err

    patch = pytest.MonkeyPatch()
    patch.setenv(PROBE_DIR_ENV, str(folder / "probe"))
    try:
        args = [*common, "--resume_from_checkpoint", checkpoint, "--per_device_train_batch_size", "8"]
        assert main(args) == 0
    finally:
        patch.undo()

    (resumed_row,) = records(folder / "probe", "rewards", 0)  # one step left after the checkpoint
    assert resumed_row["step"] == 1
    both_ranks = [records(ddp.probe, "rewards", rank)[1]["prompts"] for rank in (0, 1)]
    assert Counter(resumed_row["prompts"]) == Counter(both_ranks[0] + both_ranks[1])
    state = json.loads((folder / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [entry.get("step") for entry in state["log_history"][:2]] == [1, 2]
    start = load_file(ddp.out / "checkpoint-1" / "model.safetensors")
    end = load_file(folder / "out" / "model.safetensors")
    assert max((end[k] - start[k]).abs().max().item() for k in start) > 1e-4


SPANNING_RUN = """
import json, os, sys
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from grpo_fixtures import PROMPTS, token_reward
from minimind_trl_cli.process_exit import exit_process
from minimind_trl import MiniMindForCausalLM
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

policy, out, algorithm = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rank = int(os.environ["RANK"])


class Recording(MiniMindGRPOTrainer):
    \"\"\"Saves what each rank computed: gathered rewards and its advantages (before TRL's shuffle), and every
    loss with its inputs and the weights it was computed with.\"\"\"

    calls = 0

    def _calculate_rewards(self, *args):
        self._gathered = super()._calculate_rewards(*args).clone()
        return self._gathered

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        batch = {k: output[k] for k in ("prompt_ids", "completion_ids", "completion_mask", "advantages")}
        torch.save({**batch, "rewards_per_func": self._gathered}, f"{out}/scored-{self.calls}-rank{rank}.pt")
        return output

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages")
        weights = {k: v.detach().clone() for k, v in self.accelerator.unwrap_model(model).state_dict().items()}
        record = {"loss": loss.item(), "weights": weights, **{k: inputs[k] for k in keys}}
        torch.save(record, f"{out}/loss-{self.calls}-rank{rank}.pt")
        self.calls += 1
        return loss


args = MiniMindGRPOConfig(
    output_dir=f"{out}/run", use_cpu=True, bf16=False, report_to="none", save_strategy="no", max_steps=2,
    per_device_train_batch_size=4, num_generations=8, max_completion_length=8, max_prompt_length=32,
    optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", weight_decay=0.0, seed=7,
    dataloader_num_workers=0, disable_tqdm=True, **algorithm,
)
dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])
trainer = Recording(
    MiniMindForCausalLM.from_pretrained(policy), token_reward, args, train_dataset=dataset,
    processing_class=AutoTokenizer.from_pretrained(policy),
)
trainer.train()
if rank == 0:
    torch.save(trainer.accelerator.unwrap_model(trainer.model).state_dict(), f"{out}/final.pt")
trainer.end()
exit_process(0)  # a launched process leaves without the gloo abort at exit (minimind_trl_cli.process_exit)
"""


def rank_logps_and_k3(policy, reference, batch):
    """One rank's per-token log-probs under the policy (with gradient) and the k3 KL to the reference, from the
    trainer's own inputs (prompt mask kept)."""
    import torch

    n_keep = batch["completion_ids"].size(1)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], torch.ones_like(batch["completion_mask"])], dim=1)

    def logps(model):
        logits = model(input_ids, attention_mask=attention_mask, logits_to_keep=n_keep + 1).logits[:, :-1]
        return torch.gather(logits.log_softmax(-1), 2, input_ids[:, -n_keep:, None]).squeeze(-1)

    per_token_logps = logps(policy)
    with torch.no_grad():
        ref_per_token_logps = logps(reference)
    kl = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(kl) - kl - 1
    return per_token_logps, per_token_kl


def seed_rank_loss(policy, reference, batch, beta):
    """Upstream's loss for one rank's micro-batch, from the trainer's own inputs (prompt mask kept: the documented
    deviation; this rank's prompts are one prompt, so unpadded anyway)."""
    import torch

    per_token_logps, per_token_kl = rank_logps_and_k3(policy, reference, batch)
    advantages = batch["advantages"].unsqueeze(1)
    per_token_loss = -(torch.exp(per_token_logps - per_token_logps.detach()) * advantages - beta * per_token_kl)
    mask = batch["completion_mask"]
    return ((per_token_loss * mask).sum(dim=1) / mask.sum(dim=1)).mean()


def minimind3_rank_loss(policy, reference, batch, beta):
    """MiniMind-3's CISPO loss for one rank's micro-batch, from the fixture README's formulas: on-policy, so the
    capped ratio is 1 and the loss is -(A * logp - beta * k3), each completion's masked mean, then the mean."""
    per_token_logps, per_token_kl = rank_logps_and_k3(policy, reference, batch)
    per_token_loss = -(batch["advantages"].unsqueeze(1) * per_token_logps - beta * per_token_kl)
    mask = batch["completion_mask"]
    return ((per_token_loss * mask).sum(dim=1) / mask.sum(dim=1)).mean()


# What each generation's estimator gives one process's rows of a group spanning two (the group's 8 gathered rewards,
# this rank's 4), from upstream's formulas: MiniMind2 re-normalises its own rows (the seed's double normalisation),
# MiniMind-3 keeps the group's population z-scores.
def seed_rank_advantages(rewards, rank):
    z = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    local = z[rank * 4 : (rank + 1) * 4]
    return (local - local.mean()) / (local.std() + 1e-8)


def minimind3_rank_advantages(rewards, rank):
    return ((rewards - rewards.mean()) / (rewards.std(unbiased=False) + 1e-4))[rank * 4 : (rank + 1) * 4]


# upstream's arithmetic per (advantage estimator, loss) a generation record names: a generation with a new one fails
# below until its formulas are added here
UPSTREAM_ARITHMETIC = {
    ("minimind", "grpo"): (seed_rank_advantages, seed_rank_loss),
    ("group_zscore", "minimind3_cispo"): (minimind3_rank_advantages, minimind3_rank_loss),
}
ALGORITHM = ("loss_type", "advantage_estimator", "beta", "epsilon", "epsilon_high")


def generations_by_algorithm() -> list[str]:
    """One generation of the record per distinct (estimator, loss): the agent stage trains MiniMind-3's."""
    from minimind_trl.generations import GENERATIONS

    first = {}
    for name, generation in GENERATIONS.items():
        first.setdefault((generation.advantage_estimator.value, generation.loss_type.value), name)
    return list(first.values())


@pytest.mark.parametrize("generation", generations_by_algorithm())
def test_a_group_spanning_two_processes_matches_the_single_process_computation(setup, generation):
    """G = 8 from 2 processes x 4 rows, with the generation's estimator, loss, beta and clipping from its record
    (`minimind_trl.generations`): every prompt's group is split over both processes. Each process's advantages are
    the generation's formula over all 8 gathered rewards and its own 4 rows; its loss is the generation's loss of
    its rows; and replaying both steps in one process (the two losses averaged, as DDP averages gradients; clip 1;
    SGD, so the weights compare the gradients) ends with the weights the 2 processes trained."""
    import torch

    from minimind_trl import MiniMindForCausalLM
    from minimind_trl.generations import GENERATIONS

    record = {row.name: row.value for row in GENERATIONS[generation].rows()}
    algorithm = {name: record[name] for name in ALGORITHM if name in record}
    rank_advantages, rank_loss = UPSTREAM_ARITHMETIC[algorithm["advantage_estimator"], algorithm["loss_type"]]
    folder = run_dir(setup, f"spanning_{generation}")
    script = folder / "spanning_run.py"
    script.write_text(SPANNING_RUN)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / "ddp.yaml"),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
        str(script), str(setup.policy), str(folder), json.dumps(algorithm),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]

    def load(kind, call, rank):
        return torch.load(folder / f"{kind}-{call}-rank{rank}.pt", weights_only=True)

    initial = MiniMindForCausalLM.from_pretrained(setup.policy)
    reference = MiniMindForCausalLM.from_pretrained(setup.policy).eval()
    replay = MiniMindForCausalLM.from_pretrained(setup.policy).train()
    optimizer = torch.optim.SGD(replay.parameters(), lr=1.0)
    for call in range(2):
        scored = [load("scored", call, rank) for rank in (0, 1)]
        # one prompt, split over the processes: 4 of its completions on each
        assert all(len(torch.unique(batch["prompt_ids"], dim=0)) == 1 for batch in scored)
        assert torch.equal(scored[0]["prompt_ids"][0], scored[1]["prompt_ids"][0])
        gathered = scored[0]["rewards_per_func"]
        assert torch.equal(gathered, scored[1]["rewards_per_func"]) and gathered.shape == (8, 1)
        for rank, batch in enumerate(scored):
            expected = rank_advantages(gathered[:, 0].double(), rank)
            torch.testing.assert_close(batch["advantages"].double(), expected, rtol=1e-5, atol=1e-5)

        losses = [load("loss", call, rank) for rank in (0, 1)]
        for batch in losses:  # the weights each rank computed with are the replay's
            assert_same_step(batch["weights"], replay.state_dict(), initial.state_dict(), moved=call > 0)
        rank_losses = [rank_loss(replay, reference, batch, algorithm["beta"]) for batch in losses]
        for rank, (batch, loss) in enumerate(zip(losses, rank_losses)):
            assert batch["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6), (call, rank)
        (sum(rank_losses) / 2).backward()
        torch.nn.utils.clip_grad_norm_(replay.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()

    final = torch.load(folder / "final.pt", weights_only=True)
    assert_same_step(final, replay.state_dict(), initial.state_dict(), moved=True)


def assert_same_step(weights, expected, start, moved):
    """Equal weights, or (after a step) equal updates from `start`: within 1e-5 of each tensor's update, plus
    float32 rounding of the weights themselves (~1e-7 each)."""
    import torch

    for name, tensor in expected.items():
        delta, expected_delta = weights[name] - start[name], tensor.detach() - start[name]
        if not moved:
            assert torch.equal(delta, expected_delta), name
            continue
        assert expected_delta.norm() > 1e-4, name  # the step really moved every weight
        rounding = 1.2e-7 * tensor.numel() ** 0.5
        assert (delta - expected_delta).norm() <= 1e-5 * expected_delta.norm() + rounding, name


@pytest.fixture(scope="module")
def zero3(setup):
    """2 processes under ZeRO-3, with a (whole, unpartitioned) reward model, a checkpoint at every step and the
    upstream's native .pth at every save (zero3_save_16bit_model in recipes/accelerate/zero3.yaml allows it)."""
    folder = run_dir(setup, "zero3")
    recipe = tiny_recipe(
        folder,
        setup.policy,
        setup.data,
        per_device_train_batch_size=4,
        reward_funcs=["format", "grpo_fixtures:token_reward", "reward_model"],
        reward_model_name_or_path=str(setup.reward_model),
        save_strategy="steps",
        save_steps=1,
        save_native_pth=True,
    )
    result = launch("zero3", 2, recipe, folder / "probe")
    assert result.returncode == 0, result.stderr[-4000:]
    return SimpleNamespace(folder=folder, probe=folder / "probe", out=folder / "out", recipe=recipe)


def test_zero3_two_processes_partition_and_generate(setup, zero3):
    folder, probe = zero3.folder, zero3.probe
    layouts = [records(probe, "layout", rank)[0] for rank in (0, 1)]
    from minimind_trl import MiniMindForCausalLM

    full = sum(p.numel() for p in MiniMindForCausalLM.from_pretrained(setup.policy).parameters())
    for rank, layout in enumerate(layouts):
        assert layout["world_size"] == 2 and layout["zero_stage"] == 3
        assert layout["distributed_type"] == "DistributedType.DEEPSPEED"
        assert layout["partitioned_params"] > 0 and layout["full_numel"] == full
        # each rank holds about half of the parameters (ZeRO-3 pads each tensor to a multiple of the world size)
        assert full / 2 <= layout["local_numel"] <= full / 2 + layout["partitioned_params"]
    for rank in (0, 1):
        assert [row["step"] for row in records(probe, "steps", rank)] == [1, 2]
        rows = records(probe, "rewards", rank)  # generation ran under ZeRO-3 (parameters gathered)
        assert len(rows) == 2 and all(len(row["lengths"]) == 4 and min(row["lengths"]) >= 1 for row in rows)

    out = folder / "out"
    saved = load_file(out / "model.safetensors")  # whole weights gathered at save (zero3_save_16bit_model)
    initial = load_file(setup.policy / "model.safetensors")
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in initial.items()}
    assert max((saved[k].float() - initial[k]).abs().max().item() for k in initial) > 1e-4
    card = (out / "README.md").read_text()
    assert "| reward_model (`" in card


def test_zero3_native_pth_holds_the_whole_saved_weights(zero3):
    """The .pth is read back from the gathered safetensors on one process: not ZeRO-3 partitioned (empty)."""
    import torch

    for folder in (zero3.out, zero3.out / "checkpoint-2"):
        saved = load_file(folder / "model.safetensors")
        native = torch.load(folder / "grpo_32.pth", weights_only=True)
        assert native["lm_head.weight"].shape == saved["model.embed_tokens.weight"].shape  # tied, written twice
        for key, value in saved.items():
            assert native[key].shape == value.shape and native[key].numel() > 0, key
            assert torch.equal(native[key], value.half()), key


def test_zero3_resume_from_a_deepspeed_checkpoint_is_exact(setup, zero3):
    folder = run_dir(setup, "zero3-resumed")
    checkpoint = zero3.out / "checkpoint-1"
    assert (checkpoint / "rng_state_0.pth").is_file() and list(checkpoint.glob("global_step1/*optim_states.pt"))
    args = ["--resume_from_checkpoint", str(checkpoint), "--output_dir", str(folder / "out")]
    result = launch("zero3", 2, zero3.recipe, folder / "probe", *args)
    assert result.returncode == 0, result.stderr[-4000:]
    resumed, straight = load_file(folder / "out" / "model.safetensors"), load_file(zero3.out / "model.safetensors")
    assert max((resumed[k] - straight[k]).abs().max().item() for k in straight) <= 1e-6
    for rank in (0, 1):  # the resumed ranks sampled exactly what the uninterrupted ranks sampled at step 2
        assert records(folder / "probe", "rewards", rank) == records(zero3.probe, "rewards", rank)[1:]


def test_zero2_one_process_with_lora(setup):
    from minimind_trl.cli import run_command

    folder = run_dir(setup, "zero2-lora")
    recipe = tiny_recipe(folder, setup.policy, setup.data)
    lora = ["--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    result = launch("zero2", 1, recipe, folder / "probe", *lora)
    assert result.returncode == 0, result.stderr[-4000:]

    (layout,) = records(folder / "probe", "layout", 0)
    assert layout["zero_stage"] == 2 and layout["world_size"] == 1 and layout["peft"] == "PeftModelForCausalLM"
    rank, hidden, q_out, v_out = 4, 32, 32, 16  # v_proj: 2 key/value heads x head_dim 8
    lora_params = 2 * (rank * hidden + q_out * rank + rank * hidden + v_out * rank)  # 2 layers x (A + B) x (q, v)
    assert layout["trainable"] == lora_params
    assert [row["step"] for row in records(folder / "probe", "steps", 0)] == [1, 2]
    adapter = folder / "out"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert run_command("merge-lora", [str(adapter), str(folder / "merged")]) == 0
    assert (folder / "merged" / "model.safetensors").is_file()


def test_zero3_batch_that_two_processes_cannot_split(setup):
    folder = run_dir(setup, "zero3-bad-batch")
    recipe = tiny_recipe(folder, setup.policy, setup.data, model_name_or_path="./never/loaded")
    result = launch("zero3", 2, recipe, folder / "probe", "--per_device_train_batch_size", "3")
    assert result.returncode != 0  # the launcher's own code; the ranks' is in its report
    assert re.search(r"Root Cause.*?exitcode\s*:\s*2\b", result.stderr, re.S), result.stderr[-2000:]
    assert "minimind-trl grpo: error: invalid arguments" in result.stderr
    assert "generation_batch_size (6) must be divisible by num_generations (4)" in result.stderr
    assert "[2 process(es):" in result.stderr
    # refused at parsing: the policy path (which does not exist) was never even checked, let alone loaded
    assert "never/loaded" not in result.stderr
    assert not list((folder / "probe").iterdir())  # no rank got as far as training


def test_slurm_script_launches_accelerate_on_every_node(tmp_path):
    """recipes/slurm/grpo.sbatch with stand-ins for srun/scontrol/accelerate that print what they would run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/bash\nprintf "node-a\\nnode-b\\n"\n')
    (bin_dir / "srun").write_text('#!/bin/bash\nshift\nfor id in 0 1; do SLURM_NODEID=$id "$@"; done\n')
    (bin_dir / "accelerate").write_text('#!/bin/bash\necho "accelerate $*"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2"}
    script = REPO_ROOT / "recipes" / "slurm" / "grpo.sbatch"
    result = subprocess.run(
        ["bash", str(script), "recipes/minimind2/grpo/reasoning.yaml", "--learning_rate", "1e-6"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    for node, line in enumerate(lines):
        assert line == (
            "accelerate launch --config_file recipes/accelerate/zero2.yaml --num_machines 2 --num_processes 16 "
            f"--machine_rank {node} --main_process_ip node-a --main_process_port 29500 --rdzv_backend c10d "
            "-m minimind_trl.grpo --config recipes/minimind2/grpo/reasoning.yaml --learning_rate 1e-6"
        )
