"""Training on the device, as users run it: LoRA (only the adapters train, the reference is the policy with its
adapters disabled), an exact resume of `minimind-trl grpo`, and agent rollouts that call a real tool, a few steps each.
bf16 on CUDA (the default there); the same bodies on CPU under `MINIMIND_TEST_DEVICE=cpu`."""

import json
import math

import pytest
import torch
from gpu_harness import build_trainer, one_step, tiny_policy
from grpo_fixtures import (
    PROBE_DIR_ENV,
    REPO_ROOT,
    STOP_AT_STEP_ENV,
    agent_rows,
    build_tiny_policy,
    script_tool_calls,
    tiny_recipe,
    write_rlaif,
    write_rows,
)
from safetensors.torch import load_file

from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

pytestmark = pytest.mark.gpu

# bf16: the reference log-probs of the trainer's fused head against plain logits with the adapters off (see
# test_gpu_logprobs.py for the bound); a step moves weights by ~lr = 1e-2, an inexact resume by that much
LORA_LOGP_ATOL, RESUME_ATOL = 0.03, 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def precision_flags(device: str) -> list[str]:
    return ["--use_cpu", str(device == "cpu").lower(), "--bf16", "true"]


def test_lora_trains_only_the_adapters_against_the_policy_with_adapters_disabled(tokenizer, tmp_path, device):
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], task_type="CAUSAL_LM",
                             init_lora_weights=False)  # fmt: skip  (non-zero adapters: the policy differs from its base)
    trainer = build_trainer(tokenizer, tmp_path, tiny_policy(tokenizer), device, True, peft_config, max_steps=1,
                            learning_rate=1e-2, save_strategy="no")  # fmt: skip
    assert trainer.ref_model is None  # no second copy: the reference is the base model
    inputs, _, grads = one_step(trainer, tokenizer)
    assert grads and all(".lora_" in name for name in grads)

    policy = trainer.accelerator.unwrap_model(trainer.model)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1).long().to(device)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1).long().to(device)
    keep = inputs["completion_ids"].shape[1]

    def plain_logps():
        with torch.no_grad(), trainer.accelerator.autocast():
            logits = policy(input_ids=ids, attention_mask=mask).logits[:, -keep - 1 : -1].float()
        return logits.log_softmax(-1).gather(-1, ids[:, -keep:, None]).squeeze(-1).cpu()

    with policy.disable_adapter():
        base = plain_logps()
    adapted = plain_logps()
    real = inputs["completion_mask"].bool()
    error = (inputs["ref_per_token_logps"][real] - base[real]).abs().max().item()
    assert error <= LORA_LOGP_ATOL, f"reference log-probs vs adapters disabled: {error:.3g}"
    assert (adapted[real] - base[real]).abs().max().item() > 10 * LORA_LOGP_ATOL  # the check can tell them apart

    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainer.train()  # one real step: generation on the device, the optimizer over the adapters only
    after = dict(policy.named_parameters())
    moved = {name for name, p in before.items() if not torch.equal(p, after[name].detach())}
    assert moved and all(".lora_" in name for name in moved), sorted(moved)[:5]
    assert {name for name in before if ".lora_" in name and "lora_B" in name} <= moved


def test_resume_on_the_device_ends_with_the_uninterrupted_runs_weights(tmp_path, device, monkeypatch):
    from minimind_trl.grpo import main

    policy = build_tiny_policy(tmp_path / "policy")
    data = write_rlaif(tmp_path / "rlaif.jsonl")
    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path))
    outs = {}
    for name in ("straight", "stopped"):
        (tmp_path / name).mkdir()
        recipe = tiny_recipe(tmp_path / name, policy, data, max_steps=4, save_strategy="steps", save_steps=2,
                             use_cpu=device == "cpu", bf16=True, callbacks=["grpo_fixtures:StopAfterStep"])  # fmt: skip
        outs[name] = (recipe, tmp_path / name / "out")
    assert main(["--config", str(outs["straight"][0])]) == 0
    monkeypatch.setenv(STOP_AT_STEP_ENV, "2")
    assert main(["--config", str(outs["stopped"][0])]) == 0
    monkeypatch.delenv(STOP_AT_STEP_ENV)
    stopped = outs["stopped"][1]
    assert (stopped / "checkpoint-2").is_dir() and not (stopped / "checkpoint-4").exists()
    assert main(["--config", str(outs["stopped"][0]), "--resume_from_checkpoint", "last"]) == 0
    straight, resumed = load_file(outs["straight"][1] / "model.safetensors"), load_file(stopped / "model.safetensors")
    at_two = load_file(stopped / "checkpoint-2" / "model.safetensors")
    assert max((straight[k] - resumed[k]).abs().max().item() for k in straight) <= RESUME_ATOL
    assert max((at_two[k] - resumed[k]).abs().max().item() for k in straight) > 100 * RESUME_ATOL  # steps 3-4 trained


def test_agent_rollouts_call_a_real_tool_and_train(tmp_path, device, monkeypatch):
    """`calculate_math` (the package's safe evaluator, no mock) runs on scripted first-turn calls of a random policy;
    its result comes back into the next turn's context, and a few steps train."""
    from minimind_trl.cli import main
    from minimind_trl.demos.model import build_model, build_tokenizer, save_folder
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from minimind_trl.trainer import MiniMindGRPOTrainer

    tokenizer = build_tokenizer("minimind3")
    policy = save_folder(build_model(len(tokenizer), generation="minimind3"), tokenizer, tmp_path / "policy")
    reward_model = write_tiny_internlm2_reward_model(tmp_path / "rm")
    data = write_rows(tmp_path / "agent_rl.jsonl", agent_rows(8))
    monkeypatch.setattr(MiniMindGRPOTrainer, "_generate_single_turn", MiniMindGRPOTrainer._generate_single_turn)
    script_tool_calls(MiniMindGRPOTrainer)  # scripted: '6*7' as the first call of some rollouts
    scripted, contexts = MiniMindGRPOTrainer._generate_single_turn, []

    def recording(self, prompt_ids, *args, **kwargs):
        contexts.extend(self.processing_class.decode(ids) for ids in prompt_ids)
        return scripted(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(MiniMindGRPOTrainer, "_generate_single_turn", recording)
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv(PROBE_DIR_ENV, str(probe))
    out = tmp_path / "out"
    argv = ["grpo", "--config", REPO_ROOT / "recipes" / "minimind3" / "agent" / "agent_rl.yaml",
            "--model_name_or_path", policy, "--tokenizer_name_or_path", policy, "--reward_model_name_or_path",
            reward_model, "--dataset_name", data, "--output_dir", out, "--max_steps", 3, "--save_steps", 3,
            "--max_completion_length", 10, "--agent_max_total_length", 400, "--thinking_ratio", 0.5,
            "--learning_rate", 0.01, "--save_native_pth", "false", *precision_flags(device)]  # fmt: skip
    assert main([str(value) for value in argv]) == 0

    answered = [c for c in contexts if "<tool_response>" in c]
    assert answered and all("42" in c.split("<tool_response>", 1)[1] for c in answered)  # 6*7, computed for real
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "reward" in entry]
    assert len(steps) == 3
    for entry in steps:
        assert entry["agent/tool_calls"] > 0.0 and 1.0 < entry["agent/turns"] <= 3.0 and math.isfinite(entry["loss"])
    trained, initial = load_file(out / "model.safetensors"), load_file(policy / "model.safetensors")
    assert max((trained[k].float() - initial[k].float()).abs().max().item() for k in initial) > 1e-4
