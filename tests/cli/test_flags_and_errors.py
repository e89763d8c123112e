"""One flag style and one user-error contract across `minimind-trl` commands: TRL's `--snake_case`, `--kebab-case`
accepted too; bad input ends with one `minimind-trl <command>: error:` line and exit code 2, no traceback."""

import functools
import subprocess
import sys

import pytest

from minimind_trl.cli import main as cli
from minimind_trl.demos import default as demo
from minimind_trl.cli.recipe import make_parser
from minimind_trl.errors import USER_ERROR_EXIT_CODE, MiniMindTRLError
from minimind_trl_cli.conversion import convert_parser, export_parser, merge_lora_parser
from minimind_trl_cli.flags import both_spellings
from minimind_trl_cli.hub import push_parser


def test_both_spellings():
    assert both_spellings("--num_attention_heads") == ["--num_attention_heads", "--num-attention-heads"]
    assert both_spellings("--output-dir") == ["--output_dir", "--output-dir"]
    assert both_spellings("--force") == ["--force"]
    assert both_spellings("-h") == ["-h"]


@pytest.mark.parametrize(
    "parse, snake, kebab, dest",
    [
        (convert_parser().parse_args, ["c.pth", "o", "--num_attention_heads", "4"],
         ["c.pth", "o", "--num-attention-heads", "4"], "num_attention_heads"),
        (export_parser().parse_args, ["m", "o", "--format", "llama", "--no_verify"],
         ["m", "o", "--format", "llama", "--no-verify"], "verify"),
        (merge_lora_parser().parse_args, ["a", "o", "--base_model", "b"], ["a", "o", "--base-model", "b"],
         "base_model"),
        (push_parser().parse_args, ["o", "--hub_model_id", "a/b", "--hub_private_repo"],
         ["o", "--hub-model-id", "a/b", "--hub-private-repo"], "hub_model_id"),
        (demo.parse_args, ["--output_dir", "d", "--warm_start_steps", "3"], ["--output-dir", "d", "--warm-start-steps", "3"],
         "output_dir"),
    ],
)  # fmt: skip
def test_argparse_commands_take_both_spellings(parse, snake, kebab, dest):
    assert vars(parse(snake)) == vars(parse(kebab))
    assert dest in vars(parse(snake))


def test_grpo_takes_both_spellings():
    parser = make_parser()
    snake = parser.parse_args_into_dataclasses(["--max_steps", "3", "--output_dir", "o", "--use_cpu", "true"])
    kebab = parser.parse_args_into_dataclasses(["--max-steps", "3", "--output-dir", "o", "--use-cpu", "true"])
    assert snake[1].max_steps == kebab[1].max_steps == 3


def test_every_user_error_is_one_class():
    from minimind_trl import errors

    classes = [getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)]
    assert len(classes) == len(errors.__all__) - 2  # all but USER_ERROR_EXIT_CODE and PUSH_FAILED_EXIT_CODE
    assert all(issubclass(cls, MiniMindTRLError) and issubclass(cls, ValueError) for cls in classes)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["convert", "no/such.pth", "out"], "no/such.pth: no such checkpoint file"),
        (["export", "no/such/folder", "out", "--format", "llama"], "no config.json"),
        (["merge-lora", "no/such/adapter", "out"], "not a LoRA adapter folder"),
        (["push", "no/such/folder", "--hub_model_id", "someone/model"], "no/such/folder is not a folder"),
        (["grpo", "--model_name_or_path", "./no/such/model", "--dataset_name", "x.jsonl", "--reward_funcs", "format",
          "--use_cpu", "true", "--bf16", "false"],
         "model_name_or_path: ./no/such/model does not exist"),
    ],
)  # fmt: skip
def test_user_errors_exit_2_with_one_line(argv, fragment, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli(argv) == USER_ERROR_EXIT_CODE == 2
    err = capsys.readouterr().err
    assert err.startswith(f"minimind-trl {argv[0]}: error: ") and fragment in err
    assert "Traceback" not in err


def test_the_installed_entry_point_reports_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "minimind_trl.cli", "convert", str(tmp_path / "missing.pth"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "minimind-trl convert: error:" in result.stderr and "Traceback" not in result.stderr


# A list flag (a `list[...]` field) on the command line: space-separated words, comma-separated, or the recipe's
# YAML list in brackets (quoted, or unquoted and split by the shell); docs/training.md#lists-on-the-command-line.
@pytest.mark.parametrize(
    "words",
    [
        ["mytools:f", "other:g"],
        ["mytools:f,other:g"],
        ["mytools:f, other:g"],
        ["[mytools:f, other:g]"],
        ["[mytools:f,", "other:g]"],
        ["['mytools:f', \"other:g\"]"],
    ],
)  # fmt: skip
def test_a_list_flag_takes_words_commas_or_a_bracketed_list(words):
    from minimind_trl.cli.recipe import parse_args

    script_args, *_ = parse_args(["--output_dir", "o", "--rollout", "agent", "--agent_tools", *words])
    assert script_args.agent_tools == ["mytools:f", "other:g"]


def test_one_bracketed_item_is_that_item_in_every_list_flag():
    from minimind_trl.cli.recipe import parse_args

    script_args, training_args, model_args, _ = parse_args(
        ["--output_dir", "o", "--rollout", "agent", "--agent_tools", "[mytools:f]", "--reward_funcs=[format]",
         "--reward-weights", "[0.5]", "--lora_target_modules", "[q_proj]"]
    )  # fmt: skip
    assert script_args.agent_tools == ["mytools:f"] and script_args.reward_funcs == ["format"]
    bare = parse_args(["--output_dir", "o", "--lora_target_modules", "q_proj"])[2]
    assert training_args.reward_weights == [0.5] and model_args.lora_target_modules == bare.lora_target_modules


def test_a_bracketed_item_keeps_its_quoted_comma():
    from minimind_trl.cli.recipe import parse_args

    script_args, *_ = parse_args(["--output_dir", "o", "--reward_funcs", '["models/rm,v2", format]'])
    assert script_args.reward_funcs == ["models/rm,v2", "format"]


@pytest.mark.parametrize(
    "words, fragment",
    [
        (["[mytools:f", "other:g"], "--agent_tools [mytools:f other:g: not a list"),
        (["[[mytools:f]]"], "--agent_tools [[mytools:f]]: expected a list of names or numbers"),
        (["mytools:f,,other:g"], "--agent_tools mytools:f,,other:g: an empty item"),
        (["[]"], "--agent_tools []: an empty list"),
    ],
)  # fmt: skip
def test_a_list_flag_that_is_no_list_names_the_flag_and_the_forms(words, fragment, capsys):
    assert cli(["grpo", "--output_dir", "o", "--rollout", "agent", "--agent_tools", *words]) == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("minimind-trl grpo: error: ") and fragment in err and "Traceback" not in err
    if "empty list" not in fragment:
        assert "--agent_tools a b (space-separated), --agent_tools a,b or --agent_tools '[a, b]'" in err


def test_the_documented_list_forms_give_the_same_list():
    import shlex

    from doc_blocks import commands, doc_blocks

    from minimind_trl.cli.recipe import parse_args

    (block,) = doc_blocks("training.md", "Lists on the command line", "bash", 1)
    lines = commands(block)
    assert len(lines) == 3 and all(line.startswith("minimind-trl grpo ") for line in lines)
    parsed = [parse_args(shlex.split(line)[2:])[0].agent_tools for line in lines]
    assert parsed == [["calculate_math", "mytools:word_count"]] * 3


# Every list flag of `minimind-trl grpo` (`list_keys`: the parser's own, so a new one fails the first test until it is
# here), with two items it takes and the setting they give; `agent_tools` needs `rollout: agent`.
LIST_FLAGS = {
    "reward_funcs": (["format", "tag_count"], ["format", "tag_count"]),
    "reward_weights": (["0.5", "2"], [0.5, 2.0]),
    "agent_tools": (["calculate_math", "mytools:f"], ["calculate_math", "mytools:f"]),
    "callbacks": (["mycallbacks:A", "mycallbacks:B"], ["mycallbacks:A", "mycallbacks:B"]),
    "report_to": (["tensorboard", "wandb"], ["tensorboard", "wandb"]),
    "optim_target_modules": (["attn", "mlp"], ["attn", "mlp"]),
    "lora_target_modules": (["q_proj", "v_proj"], ["q_proj", "v_proj"]),
    "lora_modules_to_save": (["lm_head", "embed_tokens"], ["lm_head", "embed_tokens"]),
    "lora_target_parameters": (["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
                               ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "label_names": (["labels", "mask"], ["labels", "mask"]),
    "include_for_metrics": (["inputs", "loss"], ["inputs", "loss"]),
    "debug": (["underflow_overflow", "tpu_metrics_debug"], ["underflow_overflow", "tpu_metrics_debug"]),
    "datasets": (["data/a.jsonl", "data/b.jsonl"], ["data/a.jsonl", "data/b.jsonl"]),
}  # fmt: skip


@functools.cache
def grpo_parser():
    return make_parser()  # built once (~0.4 s); parsing leaves it as it was unless a `--key null` is parsed


def parsed_list(flag: str, argv: list[str]):
    needs = ["--rollout", "agent"] if flag == "agent_tools" else []
    argv = ["--output_dir", "o", "--use_cpu", "true", "--bf16", "false", *needs, *argv]
    settings = grpo_parser().parse_args_into_dataclasses(argv)
    value = next(getattr(group, flag) for group in settings if hasattr(group, flag))
    return [getattr(item, "value", getattr(item, "path", item)) for item in value]  # `debug`'s enums, `datasets`'


def test_every_list_flag_is_in_the_table():
    from minimind_trl.cli.recipe import list_keys

    assert set(LIST_FLAGS) == list_keys(grpo_parser())


@pytest.mark.parametrize("flag", sorted(LIST_FLAGS))
def test_every_list_flag_takes_the_three_forms(flag):
    items, expected = LIST_FLAGS[flag]
    forms = [[f"--{flag}", *items], [f"--{flag}", ",".join(items)], [f"--{flag}", f"[{', '.join(items)}]"],
             [f"--{flag.replace('_', '-')}={','.join(items)}"]]  # fmt: skip
    assert [parsed_list(flag, form) for form in forms] == [expected] * len(forms)


@pytest.mark.parametrize("flag", sorted(LIST_FLAGS))
def test_every_list_flag_given_twice_is_refused_naming_it(flag):
    items, _ = LIST_FLAGS[flag]
    kebab = flag.replace("_", "-")
    spellings = f" (as --{flag} and --{kebab})" if kebab != flag else ""
    for first, second, named in [
        ([f"--{flag}", items[0]], [f"--{flag}", items[1]], f"--{flag} is given twice: "),
        ([f"--{flag}={items[0]}"], [f"--{kebab}", items[1]], f"--{kebab} is given twice{spellings}: "),
        ([f"--{flag}", *items], [f"--{flag}", "null"], f"--{flag} is given twice: "),
    ]:
        with pytest.raises(MiniMindTRLError) as caught:
            parsed_list(flag, [*first, "--seed", "3", *second])
        message = str(caught.value)
        assert named in message and f"give it once, as --{second[0].removeprefix('--').split('=')[0]} a b" in message
        assert "\n" not in message


def test_a_list_flag_given_twice_ends_the_command_with_one_line(capsys):
    argv = ["grpo", "--output_dir", "o", "--reward_funcs", "format", "--reward_weights", "1",
            "--reward_funcs", "tag_count"]
    assert cli(argv) == USER_ERROR_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("minimind-trl grpo: error: ") and "--reward_funcs is given twice" in err
    assert len(err.strip().splitlines()) == 1


def test_a_scalar_flag_keeps_argparses_last_one():
    argv = ["--output_dir", "o", "--use_cpu", "true", "--bf16", "false", "--seed", "3", "--seed", "4"]
    assert grpo_parser().parse_args_into_dataclasses(argv)[1].seed == 4


def test_one_name_of_a_name_or_list_flag_stays_the_name():
    """`optim_target_modules` (and `report_to`) take a string or a list: one item stays the string transformers reads
    as before (for `optim_target_modules` a regular expression), and a recipe's own one-item list stays a list."""
    assert parsed_list("report_to", ["--report_to", "tensorboard"]) == ["tensorboard"]  # transformers' own list
    argv = ["--output_dir", "o", "--use_cpu", "true", "--bf16", "false", "--optim_target_modules", r".*attn.*"]
    assert grpo_parser().parse_args_into_dataclasses(argv)[1].optim_target_modules == r".*attn.*"
