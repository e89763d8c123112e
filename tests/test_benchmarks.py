"""The benchmark scripts run end to end at toy sizes (no timing is asserted: figures live in benchmarks/README.md)."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

TOY = ["--hidden-size", "32", "--layers", "1", "--heads", "4", "--kv-heads", "2"]


def _last_json_line(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def test_grpo_step_sides_run_and_report(tmp_path, capsys, cpu_machine):
    import grpo_step

    cpu_machine(True)  # a CPU with native bf16: the automatic choice is bf16 training and decoding

    args = grpo_step.parse_args(
        [*TOY, "--new-tokens", "4", "--steps", "1", "--warmup", "0", "--rm-hidden-size", "16", "--rm-layers", "1"]
        + ["--prompt-tokens", "80"]  # longer than the questions: background text is put before them
    )
    grpo_step.prepare(args, tmp_path)
    tokenizer, _, _, conversations = grpo_step.load_shared(tmp_path)
    assert all(grpo_step.templated_length(tokenizer, c) >= 80 for c in conversations)  # both loops cut to 80
    results = {
        "seed": grpo_step.run_seed(args, tmp_path),
        "ours": grpo_step.run_ours(args, tmp_path),
        "stock": grpo_step.run_ours(args, tmp_path, stock=True),
    }
    for side in results.values():
        assert side["completion_tokens_per_step"] == 2 * 8 * 4
        assert set(side["phases"]) == set(grpo_step.PHASES)
        assert side["phases"]["generation"] > 0 and side["phases"]["backward_step"] > 0
    # (b) is the trainer's default (its CPU levers on), (c) runs TRL's own head and stock `generate`
    assert results["ours"]["levers"] == {
        "log_prob_head": "minimind_trl.trainer.speed.fast_logprobs",
        "lean_samples": 1,
        "decode_kernel": True,
        "decode_weights": "bfloat16",  # sampling_weights_dtype 'auto' under the automatic bf16 precision
        "shared_prompts": True,
    }
    assert results["stock"]["levers"] == {
        "log_prob_head": "trl.trainer.utils",
        "lean_samples": 0,
        "shared_prompts": False,  # TRL's paths compute every prompt per completion
    }
    assert [results[side]["precision"] for side in ("seed", "ours", "stock")] == ["fp32", "bf16", "bf16"]
    summary = {**grpo_step.cpu_report(), **grpo_step.report(args, results)}
    # the JSON names the CPU's capability and the precision each side ran in
    assert summary["cpu"]["capability"] == "AVX512" and summary["cpu"]["avx512_bf16"] is True
    assert summary["precision_choice"]["precision"] == "bf16"
    assert (summary["seed_precision"], summary["ours_precision"], summary["stock_precision"]) == ("fp32", "bf16", "bf16")
    json.dumps(summary)
    for key in (
        "seed_s_per_step",
        "ours_s_per_step",
        "speedup",
        "seed_peak_rss_mb",
        "ours_peak_rss_mb",
        "stock_s_per_step",
        "stock_speedup",
        "stock_peak_rss_mb",
        "lever_speedup",
    ):
        assert summary[key] > 0, key
    out = capsys.readouterr().out
    assert "(b)/(a)" in out and "CPU: AuthenticAMD AMD EPYC; torch capability AVX512; AVX512-BF16 yes, AMX no" in out
    assert "ours (b): precision bf16" in out
    roof = grpo_step.step_roofline(args, tmp_path)
    assert roof["roofline_s_per_step"] > 0 and set(roof["phases"]) == {"generation", "logprobs", "backward_step", "reward"}
    shared = roof["shared_prompts"]  # (b) computes each group's prompt once in its log-prob and backward passes
    for name in ("logprobs", "backward_step"):
        assert shared["phases"][name]["gflop"] < roof["phases"][name]["gflop"]
    for name in ("generation", "reward"):
        assert shared["phases"][name]["gflop"] == roof["phases"][name]["gflop"]
    extra = grpo_step.report_roofline(args, roof, results)
    assert extra["roofline_s_per_step"] == roof["roofline_s_per_step"] and extra["ours_efficiency"] > 0
    assert extra["ours_cpu_efficiency"] == shared["roofline_s_per_step"] / results["ours"]["cpu_s_per_step"]
    assert extra["seed_cpu_efficiency"] == roof["roofline_s_per_step"] / results["seed"]["cpu_s_per_step"]
    assert extra["stock_roofline_s_per_step"] == roof["roofline_s_per_step"]
    assert extra["speedup_ceiling"] == results["seed"]["s_per_step"] / shared["roofline_s_per_step"]
    assert "at peak" in capsys.readouterr().out
    # TRL's profiling class and the trainer's head builder are restored after the runs
    from trl.extras.profiling import ProfilingContext

    from minimind_trl.trainer.speed import fast_logprobs

    assert ProfilingContext.__exit__.__module__ == "trl.extras.profiling"
    assert fast_logprobs.add_fused_lm_head.__module__ == "minimind_trl.trainer.speed.fast_logprobs"
    assert fast_logprobs.add_fused_lm_head.__qualname__ == "add_fused_lm_head"


@pytest.mark.parametrize(
    "sampler_dtype, precision, native, expected, trained_in",
    [
        ("bf16", "fp32", True, "bfloat16", "fp32"),
        ("fp32", "bf16", True, "float32", "bf16"),
        ("auto", "fp32", True, "float32", "fp32"),
        ("auto", "auto", True, "bfloat16", "bf16"),
        ("auto", "auto", False, "float32", "fp32"),  # an AVX2 CPU: the automatic choice is fp32 throughout
        ("auto", "bf16", False, "float32", "bf16"),  # insisting on bf16 there: decoding still fp32
    ],
)
def test_grpo_step_precision_reaches_the_trainer(
    tmp_path, cpu_machine, sampler_dtype, precision, native, expected, trained_in
):
    import grpo_step

    cpu_machine(native)
    args = grpo_step.parse_args(
        [*TOY, "--new-tokens", "2", "--steps", "1", "--warmup", "0", "--rm-hidden-size", "16", "--rm-layers", "1"]
        + ["--prompts", "1", "--generations", "2", "--sampler-dtype", sampler_dtype, "--precision", precision]
    )
    grpo_step.prepare(args, tmp_path)
    result = grpo_step.run_ours(args, tmp_path)
    assert result["levers"]["decode_weights"] == expected and result["levers"]["lean_samples"] == 1
    assert result["precision"] == trained_in


@pytest.mark.parametrize("fast", ["fp32", "bf16"])
def test_roofline_peak_is_the_faster_of_fp32_and_bf16(monkeypatch, fast):
    """The efficiency is computed against the best GEMM the machine has, whatever precision a side picked: an
    AVX2 CPU's slow bf16 must not become the peak (it made a 10x-too-slow step read 46 %), nor fp32 on AMX."""
    import roofline
    import torch
    from roofline import StepShapes

    speeds = {"fp32": 86.0, "bf16": 1.4} if fast == "fp32" else {"fp32": 90.0, "bf16": 1500.0}
    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    monkeypatch.setattr(roofline, "gemm_gflops", lambda m, k, n, dtype, **kwargs: speeds[names[dtype]])
    shapes = StepShapes(256, 4, 8, 2, 32, 768, 6400, 0, 0, 0, 16, 60, 128, 16, 1, 32)
    roof = roofline.roofline(shapes)
    for name, phase in roof["phases"].items():
        assert phase["peak_dtype"] == fast and phase["peak_gflops"] == speeds[fast], name
        assert phase["peak_gflops_by_dtype"] == speeds
        assert phase["roofline_s"] == pytest.approx(phase["gflop"] / speeds[fast])
    assert roof["phases"]["generation"]["peak_gflops_warm"] == speeds[fast]


def test_grpo_step_refuses_continuous_batching_with_bf16():
    import grpo_step

    with pytest.raises(SystemExit):
        grpo_step.parse_args(["--continuous-batching"])
    assert grpo_step.parse_args(["--continuous-batching", "--precision", "fp32"]).continuous_batching


def test_seed_loop_rewards_follow_the_seed():
    import torch
    from seed_loop import SeedArgs, seed_calculate_rewards

    prompt = "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq?<|im_end|>\n<|im_start|>assistant\n"
    responses = ["<think>\na\n</think>\n<answer>\nb\n</answer>", "plain text"]
    seen = []

    def score_one(messages):
        seen.append(messages)
        return 10.0 if messages[-1]["content"] == "b" else -1.0

    rewards = seed_calculate_rewards([prompt], responses, score_one, SeedArgs(num_generations=2))
    # row 0: format 0.5 + tags 1.0 + 0.4 * (-1) + 0.6 * clip(10) = 2.9 ; row 1: -1
    torch.testing.assert_close(rewards, torch.tensor([2.9, -1.0]))
    assert [m[:2] for m in seen] == [[{"role": "system", "content": "sys"}, {"role": "user", "content": "q?"}]] * 3
    assert len(seen) == 3  # one call per completion, a second one for the answer


def test_reward_scoring_runs(capsys):
    import reward_scoring

    code = reward_scoring.main(
        [
            "--hidden-size",
            "32",
            "--layers",
            "1",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--conversations",
            "4",
            "--batch-size",
            "4",
            "--reps",
            "1",
            "--threads",
            "1",
        ]
    )
    summary = _last_json_line(capsys.readouterr().out)
    assert code == 0 and summary["scores_equal"] and summary["one_at_a_time_s"] > 0 and summary["batched_s"] > 0


def test_model_vs_llama_runs(capsys):
    import model_vs_llama

    model_vs_llama.main(
        [
            *TOY,
            "--vocab-size",
            "300",
            "--batch",
            "2",
            "--seq-len",
            "16",
            "--prompt-len",
            "8",
            "--new-tokens",
            "4",
            "--reps",
            "1",
            "--threads",
            "1",
            "--llama-source",
            "state-dict",
        ]
    )
    summary = _last_json_line(capsys.readouterr().out)
    assert summary["max_logit_diff"] <= 1e-4 and summary["same_greedy_tokens"]
    assert {"forward_ratio", "forward_backward_ratio", "decode_ratio", "worst_ratio"} <= set(summary)


def test_bf16_sampling_runs_and_sees_the_rounding(capsys):
    """The README quotes this script's KL between fp32 and bf16-GEMM sampling: both sides must have really run
    (a zero KL would mean the bf16 path fell back to fp32)."""
    import bf16_sampling

    args = ["--hidden-size", "32", "--layers", "1", "--heads", "4", "--rows", "2", "--prompt-tokens", "4"]
    bf16_sampling.main([*args, "--new-tokens", "4", "--vocab", "300"])
    results = _last_json_line(capsys.readouterr().out)["results"]
    for name in ("kernel_bf16", "autocast"):
        assert 1e-8 < results[name]["kl"] < 0.1 and 0 < results[name]["logp_diff"] and 0 <= results[name]["top1"] <= 1


@pytest.mark.parametrize(
    "generation, moe", [("minimind2", False), ("minimind3", False), ("minimind2", True), ("minimind3", True)]
)
def test_roofline_flop_count_equals_torchs_count_of_a_real_forward(generation, moe):
    """The roofline's FLOPs of a forward are what torch's FLOP counter counts on MiniMind itself (eager
    attention over the full context, LM head at every position)."""
    import torch
    from roofline import StepShapes, forward_flops
    from torch.utils.flop_counter import FlopCounterMode

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    config = MiniMindConfig(
        minimind_generation=generation, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, attn_implementation="eager", use_moe=moe, num_experts=4,
        num_experts_per_tok=2, n_shared_experts=1 if generation == "minimind2" else 0,
    )  # fmt: skip
    model = MiniMindForCausalLM(config).eval()
    batch, length = 3, 11
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 300, (batch, length)))
    shapes = StepShapes.from_config(config, completions=batch, prompt_tokens=length, new_tokens=0, rm_hidden=8, rm_layers=1)
    assert forward_flops(shapes, tokens=batch * length, context=length, head_positions=batch * length) == (
        counter.get_total_flops()
    )


@pytest.mark.parametrize("moe", [False, True])
def test_roofline_flop_count_of_shared_prompts_equals_torchs_count_of_the_shared_forward(moe):
    """The shared forward's FLOPs as torch counts them: the distinct prompts once (eager attention over the prompt),
    the completions attending to prompt + completion, the LM head at every returned position."""
    import torch
    from roofline import StepShapes, forward_flops, log_prob_forward_flops
    from torch.utils.flop_counter import FlopCounterMode

    from minimind_trl import MiniMindConfig, MiniMindForCausalLM

    config = MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            vocab_size=300, attn_implementation="eager", use_moe=moe, num_experts=4)  # fmt: skip
    model = MiniMindForCausalLM(config).eval()
    groups, generations, prompt, new = 2, 3, 7, 5
    prompts = torch.randint(0, 300, (groups, prompt)).repeat_interleave(generations, dim=0)
    input_ids = torch.cat([prompts, torch.randint(0, 300, (groups * generations, new))], dim=1)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids, attention_mask=torch.ones_like(input_ids), shared_prefix_length=prompt, use_cache=False)
    shapes = StepShapes.from_config(config, completions=6, prompt_tokens=prompt, new_tokens=new, rm_hidden=8,
                                    rm_layers=1, groups=groups)  # fmt: skip
    rows = groups * generations
    expected = forward_flops(shapes, groups * prompt, prompt, 0) + forward_flops(shapes, rows * new, prompt + new, 0)
    head = 2 * rows * (prompt + new) * 64 * 300  # the LM head over every position the forward returns
    assert counter.get_total_flops() == expected + head
    # the step's count: causal attention (half the context on average), the head at completion positions only
    prompts_once = forward_flops(shapes, groups * prompt, prompt / 2, 0)
    completions = forward_flops(shapes, rows * new, prompt + new / 2, rows * new)
    assert log_prob_forward_flops(shapes, shared_prompts=True) == prompts_once + completions
    whole_rows = forward_flops(shapes, rows * (prompt + new), (prompt + new) / 2, rows * new)
    assert log_prob_forward_flops(shapes) == whole_rows


@pytest.mark.parametrize("moe", [False, True])
def test_prompt_sharing_passes_agree_and_are_timed(capsys, moe):
    import prompt_sharing

    args = [*TOY, "--vocab-size", "300", "--prompt-tokens", "8", "--new-tokens", "4", "--reps", "1", "--threads", "1"]
    summary = prompt_sharing.main(args + (["--moe"] if moe else []))
    assert summary["max_log_prob_diff"] <= 1e-5 and summary["max_relative_grad_diff"] <= 1e-4
    assert (summary["rows"], summary["distinct_prompts"]) == (16, 2)
    assert all(summary[f"{side}_{name}_s"] > 0 for side in ("plain", "shared") for name in ("policy", "reference"))
    assert _last_json_line(capsys.readouterr().out) == summary


def test_decode_profile_splits_the_rollout_into_its_parts(capsys):
    """The parts the decode profile times cover the loop: every GEMM kind, attention, norms, sampling, prefill."""
    import decode_profile

    summary = decode_profile.main([*TOY, "--vocab-size", "300", "--rows", "4", "--prompt-tokens", "5", "--new-tokens",
                                   "4", "--rounds", "1", "--threads", "1", "--weights", "fp32"])  # fmt: skip
    expected = {"prefill", "cache copy-in", "attention", "norms", "step other", "top-k sampling", "loop other",
                "generate setup"}  # fmt: skip
    assert expected | {"gemm:qkv", "gemm:o", "gemm:gate_up", "gemm:down", "gemm:lm_head"} == set(summary["parts"])
    assert all(seconds > 0 for seconds in summary["parts"].values())
    assert sum(summary["parts"].values()) == pytest.approx(summary["timed_s"], rel=0.05)
    assert _last_json_line(capsys.readouterr().out) == summary


def test_vllm_rollouts_lean_side_runs_and_reports(capsys):
    """The lean sampler's side at a toy size (the vLLM side runs in tests/vllm_engine, where vLLM is installed)."""
    import vllm_rollouts

    summary = vllm_rollouts.main(["--size", "demo", "--sides", "lean", "--prompts", "1", "--generations", "2",
                                  "--new-tokens", "4", "--repeats", "1"])  # fmt: skip
    assert summary["rollouts_per_round"] == 2 and summary["lean_rollouts_per_s"] > 0 and summary["lean_decode_kernel"]
    assert "vllm_rollouts_per_s" not in summary and _last_json_line(capsys.readouterr().out) == summary


def test_cli_help_times_each_help_and_names_its_imports(capsys):
    """One run of a light command's help: its times, and the packages it imported the most of."""
    import cli_help

    assert cli_help.main(["--runs", "1", "--commands", "", "convert", "--no-trl"]) == 0
    summary = _last_json_line(capsys.readouterr().out)
    assert set(summary["results"]) == {"minimind-trl --help", "minimind-trl convert --help"}
    for result in summary["results"].values():
        assert result["wall_s"] > 0 and result["cpu_s"] > 0 and result["imports"]
        assert not {"torch", "transformers", "trl"} & {name for name, _ in result["imports"]}


def test_tool_call_parsing_prints_its_figures(capsys):
    import tool_call_parsing

    figures = tool_call_parsing.main(["--tags", "10", "100", "--upstream-max", "10"])
    assert set(figures) == {10, 100} and figures[100]["upstream_regex_s"] is None
    assert figures[10]["upstream_regex_s"] > 0 and figures[100]["characters"] == 100 * figures[10]["characters"] // 10
    out = capsys.readouterr().out
    assert "100 unclosed tags" in out and _last_json_line(out)["10"]["parse_tool_calls_s"] > 0


def test_demo_learning_prints_each_seeds_verdict_and_fails_on_a_seed_that_did_not_learn(capsys):
    """The real demo, too short to learn (2 GRPO steps): its row says `**no**` and what fell short, and the script
    exits 1; the row's figures are the seed's summary.json."""
    import demo_learning

    rc = demo_learning.main(["--seeds", "3", "--", "--rewards", "rules", "--steps", "2", "--warm_start_steps", "2",
                             "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 1, out
    row = next(line for line in out.splitlines() if line.startswith("| 3 |"))
    assert "| **no**: the reward's last" in row and "| 2 steps |" in row
    (summary,) = _last_json_line(out)
    assert summary["seed"] == 3 and summary["learned"] is False and summary["shortfalls"]
    assert f"{summary['reward_first10']:.3f} → {summary['reward_last10']:.3f}" in row
    assert "learned on 0 of 1 seeds" in out
