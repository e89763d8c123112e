"""One flag style and one user-error contract across `minimind-trl` commands: TRL's `--snake_case`, `--kebab-case`
accepted too; bad input ends with one `minimind-trl <command>: error:` line and exit code 2, no traceback."""

import subprocess
import sys

import pytest

from minimind_trl.cli import main as cli
from minimind_trl.demos import default as demo
from minimind_trl.command_flags import both_spellings
from minimind_trl.cli.recipe import make_parser
from minimind_trl.conversion import convert, export, merge_lora
from minimind_trl.errors import USER_ERROR_EXIT_CODE, MiniMindTRLError


def test_both_spellings():
    assert both_spellings("--num_attention_heads") == ["--num_attention_heads", "--num-attention-heads"]
    assert both_spellings("--output-dir") == ["--output_dir", "--output-dir"]
    assert both_spellings("--force") == ["--force"]
    assert both_spellings("-h") == ["-h"]


@pytest.mark.parametrize(
    "parse, snake, kebab, dest",
    [
        (convert.build_parser().parse_args, ["c.pth", "o", "--num_attention_heads", "4"],
         ["c.pth", "o", "--num-attention-heads", "4"], "num_attention_heads"),
        (export.build_parser().parse_args, ["m", "o", "--format", "llama", "--no_verify"],
         ["m", "o", "--format", "llama", "--no-verify"], "verify"),
        (merge_lora.build_parser().parse_args, ["a", "o", "--base_model", "b"], ["a", "o", "--base-model", "b"],
         "base_model"),
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

    classes = [getattr(errors, name) for name in errors.__all__ if name[0].isupper() and name != "USER_ERROR_EXIT_CODE"]
    assert all(issubclass(cls, MiniMindTRLError) and issubclass(cls, ValueError) for cls in classes)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["convert", "no/such.pth", "out"], "no/such.pth: no such checkpoint file"),
        (["export", "no/such/folder", "out", "--format", "llama"], "no config.json"),
        (["merge-lora", "no/such/adapter", "out"], "not a LoRA adapter folder"),
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
