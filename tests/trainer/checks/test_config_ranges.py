"""Every numeric setting has a declared range (`config_ranges.RANGES`), and the command line refuses what is outside it
before anything loads (also the next option to come): NaN, an infinity, a negative number or a
zero is either refused naming the key or has a documented meaning (`EXPECTED_ACCEPTED` below, written from the
fields' documentation, not from the table)."""

import dataclasses
import logging
import subprocess
import sys
import typing

import pytest
from trl import ModelConfig

from minimind_trl.cli import main as cli
from minimind_trl.cli.options import OPTIONS, REFUSED, field_defaults
from minimind_trl.cli.recipe import make_parser, parse_args
from minimind_trl.cli.script_args import GRPOScriptArguments
from minimind_trl.errors import RecipeError
from minimind_trl.trainer.checks.config_ranges import RANGES
from minimind_trl.trainer.grpo_config import MiniMindGRPOConfig

HUGE = str(10**400)  # an integer no float or tensor holds: `float(10**400)` raises OverflowError
VALUES = ("nan", "inf", "-inf", "-1", "0", HUGE)

# The values among VALUES a field takes, with what it becomes: each is a documented meaning (TRL's, transformers',
# ours). Every other (field, value) pair must be refused with an error naming the field.
EXPECTED_ACCEPTED = {
    "max_steps": {"-1": -1},  # train num_train_epochs
    "top_k": {"-1": 0, "0": 0},  # the whole vocabulary (-1: vLLM's spelling)
    "local_rank": {"-1": -1, "0": 0},  # not distributed / the launcher's rank
    "seed": {"0": 0},
    "data_seed": {"0": 0},
    "dataloader_num_workers": {"0": 0},  # load in the main process
    "beta": {"0": 0.0},  # no KL, no reference model
    "weight_decay": {"0": 0.0},
    "warmup_steps": {"0": 0.0},
    "max_grad_norm": {"0": 0.0},  # no clipping
    "label_smoothing_factor": {"0": 0.0},
    "adam_beta1": {"0": 0.0},
    "adam_beta2": {"0": 0.0},
    "eval_delay": {"0": 0.0},
    "router_aux_loss_coef": {"0": 0.0},  # TRL: 0 disables it
    "moe_aux_loss_weight": {"0": 0.0},  # the MoE load-balancing loss left out
    "vespo_k_pos": {"0": 0.0},
    "vespo_lambda_pos": {"0": 0.0},
    "vespo_k_neg": {"0": 0.0},
    "vespo_lambda_neg": {"0": 0.0},
    "top_entropy_quantile": {"0": 0.0},  # TRL: only the highest-entropy token
    "entropy_coef": {"0": 0.0},  # no entropy bonus
    "entropy_coef_min": {"0": 0.0},
    "entropy_coef_max": {"0": 0.0},
    "entropy_coef_delta": {"0": 0.0},
    "entropy_target": {"0": 0.0},
    "ref_model_mixup_alpha": {"0": 0.0},
    "min_p": {"0": 0.0},
    "vllm_importance_sampling_clip_min": {"0": 0.0},
    "max_resample_rounds": {"0": 0},  # dynamic sampling never generates again
    "num_completions_to_print": {"0": 0},
    "thinking_ratio": {"0": 0.0},  # never open_thinking
    "system_prompt_ratio": {"0": 0.0},  # no system prompt added
    "lora_dropout": {"0": 0.0},
}


def numeric_fields(cls) -> list[str]:
    hints = typing.get_type_hints(cls)

    def numeric(annotation) -> bool:
        return annotation in (int, float) or any(arg in (int, float) for arg in typing.get_args(annotation))

    return [item.name for item in dataclasses.fields(cls) if numeric(hints[item.name])]


ALL_FIELDS = sorted(
    {name for cls in (MiniMindGRPOConfig, GRPOScriptArguments, ModelConfig) for name in numeric_fields(cls)}
)


def test_every_numeric_field_has_a_declared_range():
    """A new numeric option (ours, TRL's, transformers') fails here until its range is declared."""
    assert sorted(RANGES) == ALL_FIELDS
    assert set(EXPECTED_ACCEPTED) <= set(ALL_FIELDS)


@pytest.mark.parametrize("field", ALL_FIELDS)
def test_nan_infinities_negatives_and_zero_from_the_command_line(field, tmp_path):
    defaults = field_defaults(make_parser())
    base = ["--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "false"]
    for value in VALUES:
        accepted = EXPECTED_ACCEPTED.get(field, {})
        if value in accepted and OPTIONS[field].status == REFUSED and accepted[value] != defaults[field]:
            with pytest.raises(RecipeError, match=f"{field}=.* is not supported by minimind-trl grpo"):
                parse_args([*base, f"--{field}", value])  # in range, but nothing in a run acts on it (cli.options)
            continue
        if value in accepted:
            parsed = parse_args([*base, f"--{field}", value])[:3]
            (got,) = [getattr(args, field) for args in parsed if hasattr(args, field)]
            assert got == accepted[value], (field, value, got)
            continue
        with pytest.raises(RecipeError) as caught:
            parse_args([*base, f"--{field}", value])
        assert f"--{field} {value}: must be" in str(caught.value), (field, value, str(caught.value))


@pytest.mark.parametrize("field", [field for field in ALL_FIELDS if "timeout" in field] + ["agent_max_turns"])
def test_every_timeout_and_the_turn_cap_have_an_upper_bound(field, tmp_path):
    """Finite but absurd values: `1.0e10` s overflowed `threading`'s join (every tool call then failed, exit 0);
    a billion turns stepped through empty turns for minutes."""
    base = ["--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "false"]
    with pytest.raises(RecipeError, match=rf"--{field} 1.0e10: must be (between|in \(0,)"):
        parse_args([*base, f"--{field}", "1.0e10"])


def test_a_recipe_value_outside_its_range_names_the_file_and_line(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("output_dir: out\nuse_cpu: true\nbf16: false\nbeta: .nan\n")
    with pytest.raises(RecipeError, match=rf"{recipe}:4: beta: must be at least 0 .*got nan"):
        parse_args(["--config", str(recipe)])


@pytest.mark.parametrize("values", [
    {"epsilon_high": float("nan")}, {"beta": -0.5}, {"moe_aux_loss_weight": float("nan")}, {"max_steps": 0},
])  # fmt: skip
def test_the_python_api_applies_the_same_ranges(values):
    with pytest.raises(RecipeError, match=f"{next(iter(values))} must be"):
        MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **values)


@pytest.mark.parametrize("values", [
    {"max_steps": 10**400}, {"beta": 10**400}, {"seed": -(10**5000)}, {"epsilon_high": 2**63}, {"top_k": 10**20},
])  # fmt: skip
def test_an_integer_beyond_64_bits_is_refused_naming_the_key(values):
    """`float(10**400)` raised a raw OverflowError in the range check; a 5001-digit one cannot even be printed."""
    ((key, value),) = values.items()
    digits = int(abs(value).bit_length() * 0.30103) + 1
    with pytest.raises(RecipeError, match=rf"^{key} must be .*, got an integer of about {digits} digits, beyond 64 bits"):
        MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **values)


def test_a_huge_integer_in_a_recipe_names_the_file_and_line(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: out\nuse_cpu: true\nmax_steps: {HUGE}\n")
    with pytest.raises(RecipeError, match=rf"{recipe}:3: max_steps: must be .* about 401 digits, beyond 64 bits"):
        parse_args(["--config", str(recipe)])


@pytest.mark.parametrize("values, expected", [
    ({"beta": "1e-3"}, 0.001), ({"learning_rate": " 3e-4 "}, 3e-4), ({"max_steps": "5"}, 5),
    ({"epsilon_high": "5"}, 5.0), ({"max_prompt_length": "64"}, 64), ({"reward_weights": ["1e-3", 2]}, [0.001, 2]),
])  # fmt: skip
def test_a_number_given_as_text_from_python_is_read_as_the_parser_reads_it(values, expected):
    """`MiniMindGRPOConfig(beta="1e-3")` kept the string, and the first step failed with a raw TypeError; a recipe's
    `beta: 1e-3` (a string to YAML) is read as a number by the parser, so Python reads it the same way."""
    ((key, _),) = values.items()
    got = getattr(MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **values), key)
    assert got == expected and type(got) is type(expected)


def test_a_recipes_list_of_numbers_written_like_1e_3_is_read_as_numbers(tmp_path):
    """YAML reads `1e-3` as a string, also inside a list, which the parser passes on as it is: `reward_weights:
    [1e-3, 1]` was refused as not finite."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("output_dir: out\nuse_cpu: true\nreward_funcs: [format, tag_count]\nreward_weights: [1e-3, 1]\n")
    assert parse_args(["--config", str(recipe)])[1].reward_weights == [0.001, 1.0]


@pytest.mark.parametrize("values, message", [
    ({"beta": "a lot"}, "beta must be a number, got 'a lot'"),
    ({"max_steps": "1e3"}, "max_steps must be an integer, got '1e3'"),
    ({"reward_weights": [1.0, "heavy"]}, r"reward_weights\[1\] must be a number, got 'heavy'"),
    ({"beta": "nan"}, "beta must be at least 0 .*got nan"),
])  # fmt: skip
def test_text_that_is_not_a_number_is_refused_naming_the_key(values, message):
    with pytest.raises(RecipeError, match=f"^{message}"):
        MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **values)


@pytest.mark.parametrize("key", ["lr_scheduler_kwargs", "generation_kwargs", "model_init_kwargs"])
def test_a_dict_setting_given_as_text_that_is_not_json_names_the_key(key, tmp_path):
    """transformers reads a dict setting's text with `json.loads`: YAML's `{a: 1}` was a raw JSONDecodeError."""
    with pytest.raises(RecipeError, match=rf"^{key} is not JSON \(.*\): '\{{a: 1\}}'; give a dict"):
        MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **{key: "{a: 1}"})
    base = ["--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--bf16", "false"]
    with pytest.raises(RecipeError, match=rf"^--{key} \{{a: 1\}}: not JSON"):
        parse_args([*base, f"--{key}", "{a: 1}"])


# --------------------------------------------------------------------------- out-of-range values as users met them


@pytest.mark.parametrize("loss_type, flag, value", [
    ("minimind3_cispo", "--epsilon_high", "-1"),  # 1: the exact opposite update
    ("cispo", "--epsilon_high", "0"),  # 1: nothing learnt
    ("grpo", "--epsilon_high", "nan"),  # 2: NaN weights, exit 0
    ("grpo", "--beta", "nan"),  # 2
    ("minimind3_grpo", "--epsilon", "-0.2"),  # 3: positive advantages get no gradient
    ("grpo", "--epsilon_high", "-0.2"),  # 3
    ("grpo", "--beta", "-0.02"),  # 3: the KL penalty becomes a bonus
])  # fmt: skip
def test_a_loss_setting_outside_its_range_is_one_line_before_any_model(tmp_path, capsys, monkeypatch, loss_type, flag,
                                                                       value):  # fmt: skip
    from minimind_trl.cli import build

    monkeypatch.setattr(build, "build_from_plan", lambda *a, **k: pytest.fail("a model was loaded"))
    extra = ["--epsilon_high", "5.0"] if loss_type == "minimind3_cispo" and flag != "--epsilon_high" else []
    argv = ["grpo", "--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false", "--loss_type", loss_type]
    assert cli([*argv, *extra, flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minimind-trl grpo: error: {flag} {value}: must be") and len(err.splitlines()) == 1, err


def test_the_installed_command_refuses_a_nan_beta(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "minimind_trl.cli", "grpo", "--output_dir", str(tmp_path), "--beta", "nan"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error" in line]
    assert line.startswith("minimind-trl grpo: error: --beta nan: must be at least 0")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("settings, warns", [
    ({"loss_type": "cispo"}, "epsilon (epsilon_high is unset) = 0.2, below 1"),  # TRL falls back to epsilon
    ({"loss_type": "minimind3_cispo", "epsilon_high": 0.5}, "epsilon_high = 0.5, below 1"),
    ({"loss_type": "minimind3_cispo", "epsilon_high": 5.0}, None),
    ({"loss_type": "grpo", "epsilon_high": 0.5}, None),  # the clip's upper bound is 1 + epsilon_high
])  # fmt: skip
def test_a_cispo_cap_below_one_warns(settings, warns, caplog):
    with caplog.at_level(logging.WARNING, logger="minimind_trl.trainer.checks.config_ranges"):
        MiniMindGRPOConfig("out", use_cpu=True, bf16=False, **settings)
    messages = [record.message for record in caplog.records]
    assert (warns is None and not messages) or (len(messages) == 1 and warns in messages[0]), messages


@pytest.mark.parametrize("values", [{"share_prompts": "yes"}, {"share_prompts": "no"}, {"dynamic_sampling": 1},
                                    {"use_vllm": "false"}, {"bf16": "true"}])
def test_a_flag_given_something_other_than_true_or_false_is_refused(values):
    """Only true or false: MiniMindGRPOConfig(share_prompts="yes") must not pass (and "no" would switch it on)."""
    (key, value), = values.items()
    with pytest.raises(RecipeError, match=f"{key} must be true or false.*got {value!r}"):
        MiniMindGRPOConfig(output_dir="unused", use_cpu=True, **values)
