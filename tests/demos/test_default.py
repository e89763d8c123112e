"""`minimind-trl demo`: a short real run (warm start + GRPO through `minimind_trl.grpo`) leaves well-formed
outputs, Ctrl-C leaves a loadable model, the bundled data is what the demo claims, `--rewards full` runs the reward
model under TRL's names and writes summary.json, and (slow) the default run learns: its last 10 GRPO steps beat its
first 10 by 0.5 or more and its answers move to the question's language (+0.3 share)."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer
from warning_counts import recorded_warnings

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.demos import default as demo
from minimind_trl.cli import main as cli
from minimind_trl.data import load_rlaif_dataset
from minimind_trl.demos.progress import DemoProgress, format_step_line, reward_windows
from minimind_trl.demos.verdict import DID_NOT_LEARN_EXIT_CODE
from minimind_trl.cli.recipe import parse_recipe, resolve_recipe
from minimind_trl.rewards import format_reward, tag_count_reward

SMOKE_ARGS = ["--rewards", "rules", "--steps", "4", "--warm-start-steps", "2", "--seed", "0", "--threads", "1"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPEATED_WARNINGS = {}  # each module fixture's demo run -> the warnings it gave more than once (`warning_counts`)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """One real `minimind-trl demo` run, through the CLI dispatcher, shared by the output checks below; records the
    `minimind-trl grpo` stages it went through (those `minimind-trl grpo` runs)."""
    from minimind_trl.cli import build, grpo, recipe

    calls = []

    def spy(module, name):
        original = getattr(module, name)

        def recorded(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return recorded

    output_dir = tmp_path_factory.mktemp("demo") / "out"
    with pytest.MonkeyPatch.context() as patch:
        for module, name in ((recipe, "parse_recipe"), (build, "build_trainer"), (grpo, "run")):
            patch.setattr(module, name, spy(module, name))
        with recorded_warnings() as recorded:
            rc = cli(["demo", *SMOKE_ARGS, "--output-dir", str(output_dir)])
    REPEATED_WARNINGS["smoke_run"] = recorded.repeated()
    return rc, output_dir, calls


def test_a_run_too_short_to_learn_exits_1_and_its_summary_says_why(smoke_run):
    """4 GRPO steps after 2 SFT steps do not gain the rules demo's +0.5: the run ends with its outputs written, says
    what fell short and exits 1 (`verdict.DID_NOT_LEARN_EXIT_CODE`) instead of a success-shaped 0."""
    rc, output_dir, _ = smoke_run
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    assert summary["reward_gain"] < 0.5 and summary["learned"] is False
    assert summary["shortfalls"] == [f"the reward's last 2 steps beat its first 2 by {summary['reward_gain']:+.3f} "
                                     "(the demo's bar: +0.5)"]
    assert rc == DID_NOT_LEARN_EXIT_CODE == 1


def test_demo_trains_through_the_grpo_entry_points(smoke_run):
    """The demo is a recipe for `minimind-trl grpo`'s own code, not a trainer of its own."""
    _, output_dir, calls = smoke_run
    assert calls == ["parse_recipe", "build_trainer", "run"]
    assert json.loads((output_dir / demo.RUN_MARKER).read_text())["command"] == "minimind-trl demo"


def test_metrics_jsonl_has_one_record_per_step(smoke_run):
    _, output_dir, _ = smoke_run
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [record["step"] for record in records] == [1, 2, 3, 4]
    for record in records:
        assert math.isfinite(record["reward"]) and 0.0 <= record["reward"] <= 1.5
        # the total TRL logs is the sum of the two rule rewards it logs separately
        parts = record["rewards/format_reward/mean"] + record["rewards/tag_count_reward/mean"]
        assert record["reward"] == pytest.approx(parts, abs=1e-6)
        assert "kl" in record and "completions/mean_length" in record


def test_reward_curve_png(smoke_run):
    pytest.importorskip("matplotlib")
    _, output_dir, _ = smoke_run
    png = output_dir / "reward_curve.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert not list(output_dir.glob(".*.tmp"))


def test_reward_curve_keeps_the_whole_weighted_total_in_view(tmp_path, monkeypatch):
    """The full demo's total weighs the rule terms 3 (up to 7.5): the plot's y-axis must hold all of it."""
    from minimind_trl.demos.progress import plot_reward_curve

    plt = pytest.importorskip("matplotlib.pyplot")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    records = [{"step": step, "reward": -3.5 + 10.5 * step / 40, "rewards/format_reward/mean": 0.5,
                "rewards/tag_count_reward/mean": 1.0, "rewards/reward_model/mean": 2.0} for step in range(1, 41)]
    assert plot_reward_curve(records, tmp_path / "curve.png", "t") is not None
    low, high = figures[0].axes[0].get_ylim()
    assert low <= -3.5 + 10.5 / 40 and high >= 7.0, (low, high)


def test_saved_folder_loads_and_generates(smoke_run):
    _, output_dir, _ = smoke_run
    model = AutoModelForCausalLM.from_pretrained(output_dir)  # no trust_remote_code: the package registers it
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert isinstance(model, MiniMindForCausalLM)
    assert model.config.hidden_size == demo.DemoModel.hidden_size
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 plus 1?"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def _check_native_pth(folder):
    """The folder's `grpo_64.pth` loads with weights_only=True, strictly into MiniMind's (upstream's) keys, and
    holds the folder's weights (fp16)."""
    (pth,) = folder.glob("grpo_*.pth")
    assert pth.name == f"grpo_{demo.DemoModel.hidden_size}.pth"
    state_dict = torch.load(pth, weights_only=True)
    saved = MiniMindForCausalLM.from_pretrained(folder)
    fresh = MiniMindForCausalLM(MiniMindConfig.from_pretrained(folder))
    fresh.load_state_dict(state_dict, strict=True)
    for name, tensor in saved.state_dict().items():
        assert state_dict[name].dtype == torch.float16
        torch.testing.assert_close(state_dict[name].float(), tensor, atol=1e-3, rtol=1e-3)


def test_native_pth_loads_strictly(smoke_run):
    _, output_dir, _ = smoke_run
    _check_native_pth(output_dir)


def test_warm_start_policy_is_kept_for_the_recipe(smoke_run):
    """The GRPO recipe was fed a real save_pretrained folder (the warm-started policy), as `grpo` would be."""
    _, output_dir, _ = smoke_run
    policy = output_dir / demo.WARM_START_DIR
    assert (policy / "config.json").is_file() and (policy / "tokenizer.json").is_file()
    assert (output_dir / demo.RUN_MARKER).is_file()


def test_ctrl_c_leaves_a_loadable_model(tmp_path, monkeypatch, capsys):
    original_on_log = DemoProgress.on_log

    def on_log_then_ctrl_c(self, args, state, control, logs=None, **kwargs):
        original_on_log(self, args, state, control, logs=logs, **kwargs)
        if state.global_step >= 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(DemoProgress, "on_log", on_log_then_ctrl_c)
    output_dir = tmp_path / "out"
    rc = demo.main([*SMOKE_ARGS, "--steps", "6", "--output-dir", str(output_dir)])
    assert rc == 130
    folder = output_dir / "interrupted-step-2"
    assert folder.is_dir() and not (output_dir / "interrupted-step-2.tmp").exists()
    assert f"interrupted at step 2, model saved to: {folder}" in capsys.readouterr().out
    _check_native_pth(folder)
    assert AutoTokenizer.from_pretrained(folder).chat_template
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2]


def test_refuses_an_output_dir_that_is_not_a_demo_run(tmp_path, capsys):
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    assert cli(["demo", "--output-dir", str(tmp_path)]) == 2
    assert "not an earlier demo run" in capsys.readouterr().err
    assert precious.read_text() == "keep me"


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        demo.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        demo.parse_args(["--warm-start-steps", "-1"])


# --------------------------------------------------------------------------- bundled data


def test_bundled_prompts_are_rlaif_data_in_both_languages():
    dataset = load_rlaif_dataset(str(demo.PROMPTS_FILE))
    assert len(dataset) >= 200
    prompts = [row["prompt"][-1]["content"] for row in dataset]
    assert len(set(prompts)) == len(prompts)
    chinese = sum(bool(re.search(r"[\u4e00-\u9fff]", prompt)) for prompt in prompts)
    assert 0.3 * len(prompts) < chinese < 0.7 * len(prompts)


def test_bundled_format_examples_earn_the_full_rule_reward():
    conversations = demo.read_conversations(demo.FORMAT_EXAMPLES_FILE)
    replies = [turns[-1]["content"] for turns in conversations]
    prompts = [turns[0]["content"] for turns in conversations]
    assert set(format_reward(prompts, replies)) == {0.5}
    assert set(tag_count_reward(prompts, replies)) == {1.0}
    assert set(prompts) == {row["prompt"][-1]["content"] for row in load_rlaif_dataset(str(demo.PROMPTS_FILE))}


def test_tokenizer_keeps_the_tags_as_single_tokens():
    tokenizer = demo.build_tokenizer()
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1
    ids = tokenizer("<think>\nx\n</think>", add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>"


# --------------------------------------------------------------------------- progress helpers


def test_reward_windows_compare_first_and_last_steps():
    records = [{"step": i + 1, "reward": float(i)} for i in range(30)]
    assert reward_windows(records) == (10, 4.5, 24.5)
    assert reward_windows(records[:6]) == (3, 1.0, 4.0)  # window shrinks to half the run
    assert reward_windows(records[:1]) is None


def test_step_line_shows_the_logged_values():
    line = format_step_line(
        {"step": 7, "reward": 1.25, "rewards/format_reward/mean": 0.5, "rewards/tag_count_reward/mean": 0.75,
         "completions/mean_length": 12.0, "kl": 0.0123},
        300,
    )
    assert line == "step   7/300 | reward 1.250 | format 0.500 | tags 0.750 | len 12.0 | kl 0.0123"


# --------------------------------------------------------------------------- does it learn (slow)


@pytest.mark.slow(minutes=3)
def test_the_default_demo_learns_the_reward_models_preference(tmp_path, capsys):
    """The Quickstart's first command with its defaults (`--rewards full`, seed 42): the last 10 GRPO steps' mean
    total reward is at least 0.5 above the first 10's, the share of held-out prompts answered in the question's
    language, checked without the reward model, rises by at least 0.3 (the demo's targets, docs/demo.md), and on those
    held-out prompts the layout improves too: both rule terms are higher after GRPO than before.

    One seed, the one every newcomer runs: it passed these checks on each CPU path tried (AMD Zen 4, natively and with
    its kernels capped at AVX2; an Intel Xeon with AMX, and that Xeon capped at AVX2). The bars here are above the
    demo's own verdict (which asks the held-out total and format term to rise): on other seeds the language share
    moves less (seed 1 on AVX2 kernels: 18 % -> 50 %). Every seed's figures: docs/demo.md, measured with
    benchmarks/demo_learning.py."""
    output_dir = tmp_path / "out"
    assert demo.main(["--output-dir", str(output_dir)]) == 0
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    assert summary["rewards"] == "full" and summary["reward_window"] == 10
    assert summary["reward_last10"] - summary["reward_first10"] >= 0.5, summary
    assert summary["content_after"] - summary["content_before"] >= 0.3, summary
    for name in ("format_reward", "tag_count_reward"):
        before, after = summary["held_out_terms"][name]
        assert after > before, (name, summary["held_out_terms"])
    # Learning the layout alone lifts the content share too (the reward model weighted 0: 16% -> 49% on seed 42),
    # so also check that it is the reward model's term that rises (weighted 0 it moved by +0.28; here ~+4).
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    term = [record["rewards/reward_model/mean"] for record in records]
    assert sum(term[-10:]) / 10 - sum(term[:10]) / 10 >= 1.0, term
    out = capsys.readouterr().out
    assert "Reward model: tiny InternLM2 layout" in out and "held-out pairwise accuracy" in out


@pytest.mark.slow(minutes=2)
def test_the_rules_demo_learns_the_format(tmp_path, capsys):
    """`--rewards rules` (layout only): the last 10 GRPO steps' mean rule reward is at least 0.5 above the first
    10's, the summary says so and names the warm start."""
    output_dir = tmp_path / "out"
    assert demo.main(["--rewards", "rules", "--output-dir", str(output_dir)]) == 0
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    window, first, last = reward_windows(records)
    assert window == 10 and last - first >= 0.5, (first, last)
    out = capsys.readouterr().out
    assert "Warm start:" in out and "SFTTrainer" in out
    assert f"first 10 steps {first:.3f} -> last 10 steps {last:.3f}" in out


# --------------------------------------------------------------------------- the warm start's stopping rule


def test_warm_start_stops_at_the_first_probe_that_reaches_the_target(tmp_path, monkeypatch):
    """Probes every `probe_every` steps from `min_steps` on; the first share >= `target_layout_share` ends the SFT."""
    tokenizer = demo.build_tokenizer()
    model = demo.build_model(len(tokenizer))
    shares = iter([0.0, 0.05, 0.2, 0.9])
    probed_at = []

    def scripted_share(probed_model, probed_tokenizer, grpo_args, prompts, variant):
        probed_at.append(len(prompts))
        return next(shares)

    monkeypatch.setattr(demo, "layout_share", scripted_share)
    _, grpo_args, _, _ = demo_parse_recipe(tmp_path)
    warm = demo.warm_start(model, tokenizer, 0, None, str(tmp_path / "sft"), grpo_args)
    recipe = yaml.safe_load(Path(resolve_recipe(demo.WARM_START_RECIPE)).read_text())
    assert 0.05 < recipe["target_layout_share"] <= 0.2  # so the scripted shares stop it at the third probe
    assert recipe["min_steps"] % recipe["probe_every"] == 0  # so the first probe is at min_steps
    third_probe = recipe["min_steps"] + 2 * recipe["probe_every"]
    assert third_probe <= recipe["max_steps"]
    assert (warm.steps, warm.layout_share, warm.target) == (third_probe, 0.2, recipe["target_layout_share"])
    assert probed_at == [recipe["probe_prompts"]] * 3


def test_warm_start_with_a_step_count_runs_exactly_that_many_without_probing(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "layout_share", lambda *args: pytest.fail("no probe when the steps are given"))
    tokenizer = demo.build_tokenizer()
    _, grpo_args, _, _ = demo_parse_recipe(tmp_path)
    warm = demo.warm_start(demo.build_model(len(tokenizer)), tokenizer, 0, 12, str(tmp_path / "sft"), grpo_args)
    assert (warm.steps, warm.layout_share) == (12, None)


def test_layout_probe_leaves_the_random_stream_alone(tmp_path):
    tokenizer = demo.build_tokenizer()
    model = demo.build_model(len(tokenizer))
    _, grpo_args, _, _ = demo_parse_recipe(tmp_path)
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    share = demo.layout_share(model, tokenizer, grpo_args, ["What is 7 plus 5?", "狗有几条腿？"])
    assert 0.0 <= share <= 1.0
    assert torch.equal(torch.rand(4), expected)


def test_the_warm_start_line_says_whether_the_target_or_the_cap_stopped_it():
    assert demo.WarmStart(65, 0.125, 0.08).why_it_stopped() == (
        ", until 12% of its sampled completions had the exact layout (target 8%)"
    )
    assert "its cap" in demo.WarmStart(120, 0.03, 0.08).why_it_stopped()
    assert "short of the target 8%" in demo.WarmStart(120, 0.03, 0.08).why_it_stopped()
    assert demo.WarmStart(12, None, 0.0).why_it_stopped() == ""


def demo_parse_recipe(tmp_path):
    return parse_recipe(demo.GRPO_RECIPE, {"dataset_name": str(demo.PROMPTS_FILE), "output_dir": str(tmp_path)})


# --------------------------------------------------------------------------- --rewards full


FULL_SMOKE_ARGS = ["--rewards", "full", "--steps", "3", "--warm-start-steps", "2", "--reward-model-steps", "3",
                   "--seed", "0", "--threads", "1"]


@pytest.fixture(scope="module")
def full_smoke_run(tmp_path_factory):
    """One short `minimind-trl demo --rewards full` run: a 3-step reward model, 3 GRPO steps. What it printed is in
    `stdout.txt` beside the output folder."""
    from contextlib import redirect_stdout
    from io import StringIO

    output_dir = tmp_path_factory.mktemp("demo-full") / "out"
    with redirect_stdout(StringIO()) as printed, recorded_warnings() as recorded:
        rc = cli(["demo", *FULL_SMOKE_ARGS, "--output-dir", str(output_dir)])
    REPEATED_WARNINGS["full_smoke_run"] = recorded.repeated()
    (output_dir.parent / "stdout.txt").write_text(printed.getvalue(), encoding="utf-8")
    return rc, output_dir


def test_full_reward_demo_logs_every_term_under_trls_names(full_smoke_run):
    rc, output_dir = full_smoke_run
    assert rc == DID_NOT_LEARN_EXIT_CODE  # 3 steps: the layout is not learnt, and the run says so
    assert json.loads((output_dir / demo.SUMMARY_FILE).read_text())["learned"] is False
    assert "minimind-trl demo: this run did not learn:" not in (output_dir.parent / "stdout.txt").read_text()  # stderr
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    weights = yaml.safe_load(Path(resolve_recipe(demo.GRPO_FULL_RECIPE)).read_text())["reward_weights"]
    for record in records:
        terms = [record[f"rewards/{name}/mean"] for name in ("format_reward", "tag_count_reward", "reward_model")]
        assert -3.0 <= terms[2] <= 3.0  # clipped
        assert record["reward"] == pytest.approx(sum(w * t for w, t in zip(weights, terms)), abs=1e-5)


def test_full_reward_demo_writes_summary_json(full_smoke_run):
    _, output_dir = full_smoke_run
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    window, first, last = reward_windows(records)
    assert (summary["reward_first10"], summary["reward_last10"]) == (pytest.approx(first), pytest.approx(last))
    assert summary["content_metric"] == "answer in the question's language"
    for key in ("content_before", "content_after"):
        assert 0.0 <= summary[key] <= 1.0
    assert summary["reward_funcs"] == ["format", "tag_count", "reward_model"]
    assert summary["reward_model"]["steps"] == 3


def test_full_reward_demo_reports_each_term_before_and_after_on_the_held_out_prompts(full_smoke_run, tmp_path):
    """summary.json's `held_out_terms`: TRL's names of the run's reward functions and the weighted total, before and
    after; the rule terms after GRPO are those of the saved model's held-out samples, recomputed here."""
    from minimind_trl.demos.held_out import sample_held_out
    from minimind_trl.demos.reward_model import bundled_texts

    _, output_dir = full_smoke_run
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    terms = summary["held_out_terms"]
    assert list(terms) == ["format_reward", "tag_count_reward", "reward_model", "reward"]
    weights = yaml.safe_load(Path(resolve_recipe(demo.GRPO_FULL_RECIPE)).read_text())["reward_weights"]
    assert summary["reward_weights"] == weights
    for when in (0, 1):
        weighted = sum(weight * terms[name][when] for weight, name in zip(weights, list(terms)[:3]))
        assert terms["reward"][when] == pytest.approx(weighted)
    held_out = bundled_texts()[1]
    assert summary["held_out_prompts"] == len(held_out) and not summary["held_out_trained_on"]
    _, grpo_args, _, _ = demo_parse_recipe(tmp_path)
    model, tokenizer = MiniMindForCausalLM.from_pretrained(output_dir), AutoTokenizer.from_pretrained(output_dir)
    sample = sample_held_out(model, tokenizer, grpo_args, held_out, demo.CONTENT_SAMPLES, seed=0)
    assert len(sample.completions) == summary["content_completions"]
    for text, ids in zip(sample.completions, sample.completion_ids):  # as TRL hands them to reward functions
        assert tokenizer.decode(ids, skip_special_tokens=True) == text and len(ids) <= grpo_args.max_completion_length
        assert tokenizer.eos_token_id not in ids[:-1]
    for name, reward in (("format_reward", format_reward), ("tag_count_reward", tag_count_reward)):
        values = reward(sample.questions, sample.completions)
        assert terms[name][1] == pytest.approx(sum(values) / len(values)), name


def test_full_reward_demo_prints_each_term_before_and_after_on_the_held_out_prompts(full_smoke_run):
    """The printed summary has one line per reward term (and the total) with summary.json's held-out values."""
    _, output_dir = full_smoke_run
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    printed = (output_dir.parent / "stdout.txt").read_text(encoding="utf-8")
    completions, prompts = summary["content_completions"], summary["held_out_prompts"]
    assert f"on {completions} completions for {prompts} prompts held out" in printed
    for name, (before, after) in summary["held_out_terms"].items():
        label = "total (weighted sum)" if name == "reward" else name
        values = f"{before:+.3f} -> {after:+.3f}  ({after - before:+.3f})"
        assert re.search(rf"^  {re.escape(label)} +{re.escape(values)}$", printed, re.M), (name, printed)


def test_full_reward_demo_trains_on_prompts_the_content_check_does_not_use(full_smoke_run):
    from minimind_trl.demos.reward_model import bundled_texts

    _, output_dir = full_smoke_run
    dataset = json.loads((output_dir / demo.SUMMARY_FILE).read_text())["grpo_dataset"]
    assert dataset == str(output_dir / demo.GRPO_PROMPTS_FILE)
    trained = {row["prompt"][-1]["content"] for row in load_rlaif_dataset(dataset)}
    train, held_out, _ = bundled_texts()
    assert trained == set(train) and not trained & set(held_out) and len(held_out) >= 50


def test_full_reward_demo_reward_model_loads_strictly_in_internlm2_layout(full_smoke_run):
    from minimind_trl.models.internlm2_reward import InternLM2ForRewardModel, load_internlm2_reward_model

    _, output_dir = full_smoke_run
    folder = output_dir / demo.REWARD_MODEL_DIR
    model = load_internlm2_reward_model(folder)
    assert isinstance(model, InternLM2ForRewardModel)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["InternLM2ForRewardModel"]
    assert (folder / "tokenizer.model").is_file()


def test_rules_demo_summary_json_measures_content_too(smoke_run):
    _, output_dir, _ = smoke_run
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    assert summary["rewards"] == "rules" and summary["reward_model"] is None
    assert summary["reward_funcs"] == ["format", "tag_count"]


def test_content_property_reads_the_answer_without_tags():
    from minimind_trl.demos.reward_model import in_question_language

    assert in_question_language("狗有几条腿？", "<think>\n4\n</think>\n<answer>\n四条\n</answer>")
    assert not in_question_language("狗有几条腿？", "<think>\n四条\n</think>\n<answer>\n4\n</answer>")
    assert in_question_language("What is 7 plus 5?", "<answer>\n12\n</answer>")
    assert not in_question_language("What is 7 plus 5?", "<answer>\n十二\n</answer>")
    assert not in_question_language("What is 7 plus 5?", "<think>\n</think>\n<answer>\n<answer>\n</answer>")
    assert not in_question_language("What is 7 plus 5?", "<answer>\n\n</answer>")
    assert in_question_language("What is 7 plus 5?", "twelve")  # no <answer> block: the whole completion


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42])  # the demo passes its --seed: every one
def test_preference_pairs_differ_in_the_property_only(seed):
    from minimind_trl.demos.reward_model import (
        CJK, Fragments, answer_text, bundled_texts, in_question_language, make_pairs,
    )

    train, _, texts = bundled_texts()
    pairs = make_pairs(train, Fragments.from_texts(texts), 200, seed=seed)
    assert len(pairs) == 200
    for question, chosen, rejected in pairs:
        assert in_question_language(question, chosen) and not in_question_language(question, rejected)
        # same layout and think text: only the answer (and the junk around it) differs
        if chosen.startswith("<think>\n") and rejected.startswith("<think>\n"):  # not junk that opens with a tag
            assert chosen.split("\n")[1] == rejected.split("\n")[1]  # the think line
    # English questions also reject English mixed with Chinese (what seed 3's policy answered everything with)
    english = [answer_text(rejected) for question, _, rejected in pairs if not CJK.search(question)]
    mixed = [answer for answer in english if CJK.search(answer) and re.search("[A-Za-z]", answer)]
    assert 0.15 <= len(mixed) / len(english) <= 0.5, (len(mixed), len(english))


@pytest.mark.slow
def test_reward_model_prefers_the_property_on_held_out_prompts(tmp_path):
    """The demo's reward-model training as the demo runs it: >= 90% pairwise accuracy on held-out prompts, and in
    each language its preference survives the reward's clip: chosen answers score above 0 and rejected ones below
    (on average), 2 or more apart after clipping to +-3. Without the pairs' centring the model learns an offset per
    question language that the clip flattens (here English chosen answers averaged -1.11; seed 2's model once
    scored every English question's answers +2 to +7, good or bad)."""
    from statistics import mean

    from minimind_trl.demos.reward_model import (
        CJK, Fragments, bundled_texts, conversation, make_pairs, train_reward_model,
    )
    from minimind_trl.rewards.scorers import InternLM2Scorer

    train, held_out, texts = bundled_texts()
    report = train_reward_model(tmp_path / "rm", train, held_out, texts, seed=0, log=None)
    assert report["held_out_pairwise_accuracy"] >= 0.9, report

    clip = yaml.safe_load(Path(resolve_recipe(demo.GRPO_FULL_RECIPE)).read_text())["reward_model_clip"]
    scorer = InternLM2Scorer.from_pretrained(tmp_path / "rm")
    pairs = make_pairs(held_out, Fragments.from_texts(texts), 512, seed=1)
    for chinese in (False, True):
        subset = [pair for pair in pairs if bool(CJK.search(pair[0])) == chinese]
        assert len(subset) > 100
        chosen = scorer.score([conversation(question, answer) for question, answer, _ in subset])
        rejected = scorer.score([conversation(question, answer) for question, _, answer in subset])
        assert mean(chosen) > 0 > mean(rejected), (chinese, mean(chosen), mean(rejected))
        clipped = [max(-clip, min(clip, c)) - max(-clip, min(clip, r)) for c, r in zip(chosen, rejected)]
        assert mean(clipped) >= 2.0, (chinese, mean(clipped))


def test_a_rerun_may_replace_what_the_full_reward_demo_writes():
    for name in (demo.REWARD_MODEL_DIR, demo.GRPO_PROMPTS_FILE, demo.SUMMARY_FILE):
        assert demo.DEMO_OUTPUTS.match(name), name


# --------------------------------------------------------------------------- --upstream minimind3


MINIMIND3_SMOKE_ARGS = ["--upstream", "minimind3", "--steps", "3", "--warm-start-steps", "2",
                        "--reward-model-steps", "3", "--seed", "0", "--threads", "1"]
# MiniMind-3's five terms and the demo's overlong punishment (logged under its function's name)
MINIMIND3_TERMS = ("length", "thinking_length", "think_close_count", "repetition_penalty", "answer_reward_model",
                   "overlong_punishment")
OVERLONG_TERM = "minimind_trl.demos.minimind3:overlong_punishment"


@pytest.fixture(scope="module")
def minimind3_smoke_run(tmp_path_factory):
    """One short `minimind-trl demo --upstream minimind3` run: a 3-step reward model, 2 SFT steps, 3 GRPO steps."""
    output_dir = tmp_path_factory.mktemp("demo-minimind3") / "out"
    with recorded_warnings() as recorded:
        rc = cli(["demo", *MINIMIND3_SMOKE_ARGS, "--output-dir", str(output_dir)])
    REPEATED_WARNINGS["minimind3_smoke_run"] = recorded.repeated()
    return rc, output_dir


@pytest.mark.parametrize("run", ["smoke_run", "full_smoke_run", "minimind3_smoke_run"])
def test_no_warning_is_given_twice_in_a_demo_run(run, request):
    """Its reward model, warm start and GRPO steps warn nothing at every step (tests/warning_counts.py)."""
    request.getfixturevalue(run)
    assert not REPEATED_WARNINGS[run], "\n".join(REPEATED_WARNINGS[run])


def test_minimind3_demo_trains_minimind3s_grpo_and_logs_its_six_terms(minimind3_smoke_run):
    from minimind_trl.models.minimind.tokenization_minimind import MINIMIND3_CHAT_TEMPLATE

    rc, output_dir = minimind3_smoke_run
    assert rc == DID_NOT_LEARN_EXIT_CODE  # 3 steps do not move the answers' language by +0.3
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3]
    for record in records:
        terms = [record[f"rewards/{name}/mean"] for name in MINIMIND3_TERMS]
        assert -3.0 <= terms[4] <= 3.0 and -1.0 <= terms[5] <= 0.0
        assert record["reward"] == pytest.approx(sum(terms), abs=1e-5)
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    assert summary["rewards"] == "minimind3" and summary["reward_funcs"] == [*MINIMIND3_TERMS[:5], OVERLONG_TERM]
    assert set(summary["terms_first_last"]) == set(MINIMIND3_TERMS)
    args = torch.load(output_dir / "training_args.bin", weights_only=False)
    assert (args.loss_type, args.advantage_estimator, args.upstream) == ("minimind3_cispo", "group_zscore", "minimind3")
    # the model is a MiniMind-3 (q/k norms), the tokenizer MiniMind-3's template, and the card compares to d65ef2c
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    assert model.config.minimind_generation == "minimind3" and hasattr(model.model.layers[0].self_attn, "q_norm")
    assert AutoTokenizer.from_pretrained(output_dir).chat_template == MINIMIND3_CHAT_TEMPLATE
    card = (output_dir / "README.md").read_text()
    assert "upstream parity: MiniMind-3 (d65ef2c)" in card and "| thinking_ratio | 0.9 | 0.9 |" in card
    _check_native_pth(output_dir)


def test_minimind3_demo_recipe_explains_each_departure_from_minimind3():
    """Every setting where recipes/demo/grpo_minimind3.yaml departs from d65ef2c (as the run plan lists them) has a
    comment that names upstream's value, and nothing of MiniMind-3's algorithm is among them."""
    from minimind_trl.cli.run_plan import upstream_departures

    path = Path(resolve_recipe(demo.GRPO_MINIMIND3_RECIPE))
    script_args, training_args, _, _ = parse_recipe(
        demo.GRPO_MINIMIND3_RECIPE, {"dataset_name": str(demo.PROMPTS_FILE), "output_dir": "unused"}
    )
    departures = [line.split(":")[0] for line in upstream_departures(script_args, training_args)]
    assert set(departures) == {"reward_funcs", "learning_rate", "per_device_train_batch_size", "max_prompt_length",
                               "max_completion_length", "beta"}, departures  # fmt: skip
    lines = path.read_text().splitlines()
    for name in departures:
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"{name}:")]
        comment = " ".join(line.partition("#")[2] for line in lines[at : at + 3])
        assert "upstream" in comment, (name, comment)


def test_minimind3_rejects_the_seeds_rule_only_reward(capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--upstream", "minimind3", "--rewards", "rules"])
    assert "--rewards rules is the seed's" in capsys.readouterr().err


def test_minimind3_is_documented_in_help(capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--upstream {minimind2,minimind3}" in out and "grpo_minimind3.yaml" in out


@pytest.mark.cpu_kind
@pytest.mark.slow(minutes=5)
def test_the_minimind3_demo_learns_minimind3s_reward(tmp_path):
    """`minimind-trl demo --upstream minimind3` with its defaults (seed 42): the last 10 GRPO steps' mean total reward
    (MiniMind-3's five terms and the demo's overlong punishment) is at least 1.5 above the first 10's (docs/demo.md
    has every seed's), the reward model's term carries much of it (>= +1.0), the answers move to the question's
    language (checked without the reward model), and the exit code is the demo's own verdict, in summary.json.

    The run is fp32 on every CPU (the recipe's `bf16: false`), and deterministic on one CPU kind, but not the same
    on all: the GEMM kernels' summation order (MKL's AVX-512 vs AVX2 paths, AMD's vs Intel's) changes the warm start
    and the sampled trajectory. The language share is the figure that moves most between kinds: seed 42 rose by
    +0.145 on Intel Xeons with AVX-512 on an earlier commit (docs/demo.md's table has Zen 4 and AVX2 today), below
    the verdict's +0.3, where the demo says it did not learn and exits 1; so the language bound here is +0.07, half
    the smallest rise seen, while the total and reward-model gains held on every kind."""
    output_dir = tmp_path / "out"
    rc = demo.main(["--upstream", "minimind3", "--output-dir", str(output_dir)])
    summary = json.loads((output_dir / demo.SUMMARY_FILE).read_text())
    assert rc == (0 if summary["learned"] else DID_NOT_LEARN_EXIT_CODE), (rc, summary["shortfalls"])
    assert summary["rewards"] == "minimind3" and summary["reward_window"] == 10
    assert summary["reward_last10"] - summary["reward_first10"] >= 1.5, summary
    first, last = summary["terms_first_last"]["answer_reward_model"]
    assert last - first >= 1.0, summary["terms_first_last"]
    assert summary["content_after"] - summary["content_before"] >= 0.07, summary
