"""Two machines for real, on loopback: two `accelerate launch` commands with `--num_machines 2` (one process each, gloo
on CPU), as recipes/slurm/grpo.sbatch starts one per node. A tiny run trains to the end; the same run with one machine
killed (SIGKILL inside its step 4) stops the other within seconds; both then resume from `last` and end with the
uninterrupted run's weights."""

import json
import subprocess
import sys
import time

import pytest
from conftest import free_port
from grpo_fixtures import (
    KILL_AT_STEP_ENV,
    PROBE_DIR_ENV,
    REPO_ROOT,
    build_tiny_policy,
    subprocess_env,
    tiny_recipe,
    write_rlaif,
)
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

STOP_WITHIN_S = 20  # the surviving machine's exit after the killed one's (gloo sees the closed connection at once)


def start_machines(recipe, probe, *args, kill_machine=None, kill_at=None) -> list[subprocess.Popen]:
    port = free_port()
    machines = []
    for rank in (0, 1):
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(REPO_ROOT / "recipes" / "accelerate" / "ddp.yaml"),
            "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--mixed_precision", "no",
            "-m", "minimind_trl.grpo", "--config", str(recipe), "--callbacks", "grpo_fixtures:RankProbe", *args,
        ]  # fmt: skip
        extra = {PROBE_DIR_ENV: probe, "OMP_NUM_THREADS": 1}
        if rank == kill_machine:
            extra[KILL_AT_STEP_ENV] = kill_at
        machines.append(subprocess.Popen(command, env=subprocess_env(**extra), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True))  # fmt: skip
    return machines


def wait_all(machines, timeout=300) -> list[tuple[int, float, str]]:
    """(exit status, time it exited, output) of each machine."""
    ended, deadline = {}, time.monotonic() + timeout
    while len(ended) < len(machines) and time.monotonic() < deadline:
        for index, machine in enumerate(machines):
            if index not in ended and machine.poll() is not None:
                ended[index] = time.monotonic()
        time.sleep(0.1)
    for machine in machines:
        if machine.poll() is None:
            machine.kill()
    return [(m.wait(), ended.get(i, float("inf")), m.stdout.read()) for i, m in enumerate(machines)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-machines")
    policy, data = build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl")
    recipes = {}
    for name in ("straight", "killed"):
        (root / name / "probe").mkdir(parents=True)
        recipes[name] = tiny_recipe(root / name, policy, data, max_steps=4, per_device_train_batch_size=4,
                                    save_strategy="steps", save_steps=2)  # fmt: skip
    return root, recipes


def test_two_machines_train_a_killed_one_stops_the_other_and_both_resume_exactly(setup):
    root, recipes = setup
    straight = wait_all(start_machines(recipes["straight"], root / "straight" / "probe"))
    assert [code for code, _, _ in straight] == [0, 0], straight[0][2][-3000:] + straight[1][2][-3000:]
    for rank in (0, 1):
        (layout,) = [json.loads(line) for line in (root / "straight" / "probe" / f"layout-rank{rank}.jsonl").open()]
        assert (layout["rank"], layout["world_size"], layout["backend"]) == (rank, 2, "gloo")
    expected = load_file(root / "straight" / "out" / "model.safetensors")

    killed = wait_all(start_machines(recipes["killed"], root / "killed" / "probe", kill_machine=1, kill_at=3))
    (code0, end0, out0), (code1, end1, out1) = killed
    assert code1 != 0 and code0 != 0, (out0[-2000:], out1[-2000:])  # machine 1 killed; machine 0 failed, not hung
    print(f"machine 0 stopped {end0 - end1:.1f} s after machine 1 was killed")
    assert end0 - end1 <= STOP_WITHIN_S, f"machine 0 ran on {end0 - end1:.1f} s after machine 1 died"
    out = root / "killed" / "out"
    assert (out / "checkpoint-2").is_dir() and not (out / "model.safetensors").exists()

    resumed_probe = root / "killed" / "probe-resumed"
    resumed_probe.mkdir()
    resumed = wait_all(start_machines(recipes["killed"], resumed_probe, "--resume_from_checkpoint", "last"))
    assert [code for code, _, _ in resumed] == [0, 0], resumed[0][2][-3000:] + resumed[1][2][-3000:]
    for rank in (0, 1):  # each machine resumed at step 3 (global step 2), not from the start
        lines = (resumed_probe / f"rewards-rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [2, 3]
    weights = load_file(out / "model.safetensors")
    assert max((weights[k] - expected[k]).abs().max().item() for k in expected) <= 1e-6
    at_two = load_file(out / "checkpoint-2" / "model.safetensors")
    assert max((weights[k] - at_two[k]).abs().max().item() for k in expected) > 1e-4  # steps 3-4 trained
