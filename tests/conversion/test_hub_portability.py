"""A saved MiniMind folder is a self-contained Hub repository.

`save_pretrained` writes `auto_map` and copies the modeling code, so people without minimind-trl load it with
`trust_remote_code=True`; with minimind-trl installed, no remote code is needed at all.
"""

import json
import os
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.conversion.convert import convert_checkpoint

# Runs in a fresh interpreter where `import minimind_trl` fails, loads each folder with remote code and
# saves the logits for the parent process to compare.
_REMOTE_LOADER = r"""
import sys

class BlockMiniMindTrl:
    def find_spec(self, name, path=None, target=None):
        if name == "minimind_trl" or name.startswith("minimind_trl."):
            raise ImportError(f"{name} is blocked in this interpreter")
        return None

sys.meta_path.insert(0, BlockMiniMindTrl())
import torch
from transformers import AutoModel, AutoModelForCausalLM

try:
    import minimind_trl  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("minimind_trl is importable; the test would prove nothing")

input_ids, attention_mask = torch.load(sys.argv[1], weights_only=True)
results = {}
for folder in sys.argv[3:]:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    backbone = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()  # vLLM's transformers backend
    with torch.no_grad():
        results[folder] = model(input_ids, attention_mask=attention_mask).logits
        hidden = backbone(input_ids, attention_mask=attention_mask).last_hidden_state
        assert torch.equal(hidden, model.model(input_ids, attention_mask=attention_mask).last_hidden_state)
assert not any(name.startswith("minimind_trl") for name in sys.modules)
torch.save(results, sys.argv[2])
"""


def _random_model(seed: int, **kwargs) -> MiniMindForCausalLM:
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(**kwargs)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    return model


def test_saved_folders_load_with_remote_code_without_the_package(tmp_path):
    minimind2_moe = _random_model(0, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, use_moe=True,
                                  vocab_size=300)  # fmt: skip
    minimind2_moe.save_pretrained(tmp_path / "minimind2-moe")
    # a MiniMind-3 folder produced by the converter, with explicit head_dim and YaRN
    minimind3 = _random_model(1, minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=24, inference_rope_scaling=True,
                              vocab_size=300)  # fmt: skip
    torch.save({k: v.half() for k, v in minimind3.state_dict().items()}, tmp_path / "minimind3.pth")
    converted = convert_checkpoint(tmp_path / "minimind3.pth", tmp_path / "minimind3", overrides={"inference_rope_scaling": True})

    folders = {tmp_path / "minimind2-moe": minimind2_moe, tmp_path / "minimind3": converted}
    for folder in folders:
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == {
            "AutoConfig": "configuration_minimind.MiniMindConfig",
            "AutoModel": "modeling_minimind.MiniMindModel",
            "AutoModelForCausalLM": "modeling_minimind.MiniMindForCausalLM",
        }
        shipped = ("configuration_minimind.py", "modeling_minimind.py", "feed_forward_minimind.py",
                   "shared_prefix_minimind.py")  # fmt: skip
        assert all((folder / name).is_file() for name in shipped)

    input_ids = torch.randint(3, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0
    torch.save((input_ids, attention_mask), tmp_path / "inputs.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(
        [sys.executable, "-c", _REMOTE_LOADER, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt"), *map(str, folders)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    remote = torch.load(tmp_path / "out.pt", weights_only=True)
    real = attention_mask.bool()
    with torch.no_grad():
        for folder, model in folders.items():
            expected = model(input_ids, attention_mask=attention_mask).logits
            torch.testing.assert_close(remote[str(folder)][real], expected[real], atol=1e-5, rtol=0)


def test_installed_package_needs_no_remote_code(tmp_path):
    model = _random_model(2, minimind_generation="minimind3", hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, use_moe=True, vocab_size=100)  # fmt: skip
    model.save_pretrained(tmp_path / "m")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m")  # trust_remote_code defaults to False
    assert type(loaded) is MiniMindForCausalLM
    input_ids = torch.arange(3, 15).view(1, -1)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(input_ids).logits, model(input_ids).logits, atol=1e-5, rtol=0)
