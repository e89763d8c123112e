"""Settings a native `.pth` cannot show (MoE top-k, YaRN, RoPE base, MiniMind2's head count).

The GRPO recipe's `native_config` carries them to the policy's conversion (the keys of `convert --set`), and
every conversion that still assumes one says so in one warning line naming the key and how to override it:
a wrong guess loads strictly and only changes the logits.
"""

import pytest
import torch
from grpo_fixtures import tiny_recipe, write_rlaif

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.cli import main as cli
from minimind_trl.cli.policy import resolve_policy
from minimind_trl.cli.recipe import RecipeError, parse_recipe
from minimind_trl.formats.export_native import to_native_state_dict
from minimind_trl.errors import ModelSourceError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

# trained top-2 (upstream MiniMind-3 default: top-1) and run with YaRN (default: off), RoPE base 1e4 (default 1e6)
TRAINED = dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, use_moe=True, num_experts=4, num_experts_per_tok=2,
               inference_rope_scaling=True, vocab_size=6400)  # fmt: skip


def _random(**kwargs) -> MiniMindForCausalLM:
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(**kwargs)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    root = tmp_path_factory.mktemp("native")
    model = _random(**TRAINED)
    torch.save(to_native_state_dict(model), root / "full_sft_64_moe.pth")
    build_minimind_tokenizer().save_pretrained(root / "tokenizer")
    write_rlaif(root / "rlaif.jsonl")
    return root, model


def _policy_logits(root, name, capsys, **recipe_overrides):
    recipe = tiny_recipe(root / name, root / "full_sft_64_moe.pth", root / "rlaif.jsonl",
                         tokenizer_name_or_path=str(root / "tokenizer"), **recipe_overrides)  # fmt: skip
    script_args, training_args, model_args, _ = parse_recipe(str(recipe))
    source = resolve_policy(model_args, script_args, training_args)
    converted = MiniMindForCausalLM.from_pretrained(source.path).eval()
    # positions beyond YaRN's original 2048 window would be slow on CPU; YaRN changes every frequency anyway
    input_ids = torch.randint(3, 6400, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return converted(input_ids).logits, input_ids, capsys.readouterr().err


def test_recipe_native_config_reaches_the_policy_conversion(native, tmp_path, capsys):
    root, model = native
    (root / "with").mkdir()
    (root / "without").mkdir()
    got, input_ids, err = _policy_logits(
        root, "with", capsys, native_config={"num_experts_per_tok": 2, "inference_rope_scaling": True}
    )
    with torch.no_grad():
        expected = model(input_ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    assert "num_experts_per_tok=" not in err and "inference_rope_scaling=" not in err
    assert "warning: rope_theta=1e+06 ASSUMED" in err  # still assumed, and said

    guessed, _, err = _policy_logits(root, "without", capsys)
    assert (guessed - expected).abs().max().item() > 0.1  # upstream's defaults: top-1, no YaRN
    lines = [line for line in err.splitlines() if "ASSUMED" in line]
    assert len(lines) == 3, err
    assert "num_experts_per_tok=1 ASSUMED" in lines[0] and "native_config: {num_experts_per_tok: VALUE}" in lines[0]
    assert "inference_rope_scaling=false ASSUMED" in lines[1] and "--set inference_rope_scaling=VALUE" in lines[1]


def test_native_config_is_checked_before_anything_loads(native, tmp_path, capsys):
    root, _ = native
    recipe = tiny_recipe(tmp_path, root / "full_sft_64_moe.pth", root / "rlaif.jsonl",
                         tokenizer_name_or_path=str(root / "tokenizer"), native_config={"top_k": 2})  # fmt: skip
    with pytest.raises(RecipeError, match="native_config: unknown key.*top_k"):
        parse_recipe(str(recipe))
    recipe = tiny_recipe(tmp_path, root / "full_sft_64_moe.pth", root / "rlaif.jsonl",
                         tokenizer_name_or_path=str(root / "tokenizer"),
                         native_config={"num_experts_per_tok": "two"})  # fmt: skip
    with pytest.raises(RecipeError, match="native_config: num_experts_per_tok='two': expected a positive integer"):
        parse_recipe(str(recipe))
    # a folder records its settings: native_config there is a mistake, not silently ignored
    _random(**TRAINED).save_pretrained(tmp_path / "folder")
    recipe = tiny_recipe(tmp_path, tmp_path / "folder", root / "rlaif.jsonl", native_config={"rope_theta": 1e4})
    with pytest.raises(ModelSourceError, match="native_config applies to a native .pth policy"):
        resolve_policy(*[parse_recipe(str(recipe))[i] for i in (2, 0, 1)])


def test_convert_says_each_assumed_setting_once(tmp_path, capsys):
    minimind2_moe = _random(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, use_moe=True, vocab_size=300)
    torch.save(to_native_state_dict(minimind2_moe), tmp_path / "m.pth")
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "a")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert [line.split(" ASSUMED")[0].split()[-1] for line in lines] == [
        "count;", "num_experts_per_tok=2", "inference_rope_scaling=false", "rope_theta=1e+06",
    ]  # fmt: skip
    assert all("ASSUMED" in line for line in lines)
    args = ["--num_attention_heads", "4", "--set", "num_experts_per_tok=2", "--set", "rope_theta=1e6",
            "--set", "inference_rope_scaling=false"]  # fmt: skip
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "b"), *args]) == 0
    assert "ASSUMED" not in capsys.readouterr().out
