"""Folders we write, in upstream MiniMind's own environment: transformers 4.57.1 (its pinned version), no minimind-trl.

A fresh virtual environment (`pip install torch==2.13.0 transformers==4.57.1`, ~35 s here; set
`MINIMIND_TF457_PYTHON` to the python of an existing one to reuse it) loads, with `minimind_trl` blocked from
import:

* the Llama / Qwen3 / Qwen3-MoE exports with transformers' own classes: same logits (<= 1e-5) and greedy tokens
  as MiniMind here, class named by `architectures`;
* the tokenizer files (portable form): same ids and chat-template text;
* a MiniMind folder's shipped modeling code, which needs transformers 5.24: it fails at once saying so.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import FIXTURES, require_shared
from transformers import AutoTokenizer

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.conversion.export import export_hf, load_minimind_folder
from minimind_trl.models.minimind.tokenization_minimind import portable_tokenizer

pytestmark = pytest.mark.slow

PINS = ["torch==2.13.0", "transformers==4.57.1"]
TEXT = "Hello 世界, <think>2+3</think><|im_end|>"
MESSAGES = [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "<think>hi</think>"}]
CASES = {  # folder -> (upstream tokenizer, export format, MiniMindConfig kwargs)
    "minimind2-llama": ("MiniMind2", "llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)),
    "minimind3-qwen3": ("MiniMind-3", "qwen3", dict(minimind_generation="minimind3", hidden_size=64,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24)),
    "minimind3-qwen3_moe": ("MiniMind-3", "qwen3_moe", dict(minimind_generation="minimind3", hidden_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, use_moe=True,
                            num_experts=3, num_experts_per_tok=2, moe_intermediate_size=64)),
}  # fmt: skip

_LOADER = r"""
import json, sys

class BlockMiniMindTrl:
    def find_spec(self, name, path=None, target=None):
        if name == "minimind_trl" or name.startswith("minimind_trl."):
            raise ImportError(f"{name} is blocked in this interpreter")

sys.meta_path.insert(0, BlockMiniMindTrl())
import torch, transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

assert transformers.__version__ == "4.57.1", transformers.__version__
inputs = torch.load(sys.argv[1], weights_only=True)
text, messages = json.loads(sys.argv[3])
results = {}
for folder in sys.argv[4:]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out = {"ids": tokenizer(text)["input_ids"], "chat": tokenizer.apply_chat_template(messages, tokenize=False)}
    if folder.endswith("-minimind"):
        AutoConfig.from_pretrained(folder, trust_remote_code=True)
        try:
            AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        except ImportError as exc:
            out["error"] = str(exc)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        out["class"] = type(model).__name__
        with torch.no_grad():
            out["logits"] = model(inputs).logits
            out["greedy"] = model.generate(inputs[:1], max_new_tokens=8, do_sample=False, min_new_tokens=8)
    results[folder] = out
assert not any(name.startswith("minimind_trl") for name in sys.modules)
torch.save(results, sys.argv[2])
"""


@pytest.fixture(scope="module")
def tf457_python(tmp_path_factory) -> str:
    if os.environ.get("MINIMIND_TF457_PYTHON"):
        return os.environ["MINIMIND_TF457_PYTHON"]
    venv = tmp_path_factory.mktemp("tf457") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)  # fresh: nothing from this environment
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", *PINS], check=True, timeout=1800)
    return python


def _random(**kwargs) -> MiniMindForCausalLM:
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(vocab_size=6400, **kwargs)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    return model


def test_exports_and_tokenizers_load_on_transformers_457_without_the_package(tf457_python, tmp_path):
    models, tokenizers, folders = {}, {}, []
    for name, (era, fmt, kwargs) in CASES.items():
        # as every tokenizer minimind-trl loads (convert, export, the GRPO policy, merge-lora) saves
        tokenizer = portable_tokenizer(AutoTokenizer.from_pretrained(require_shared(FIXTURES / era / "tokenizer")))
        model = models[name] = _random(**kwargs)
        model.save_pretrained(tmp_path / f"{name}-minimind")
        tokenizer.save_pretrained(tmp_path / f"{name}-minimind")
        # what `minimind-trl export` does
        loaded, loaded_tokenizer = load_minimind_folder(tmp_path / f"{name}-minimind")
        export_hf(loaded, tmp_path / name, fmt, tokenizer=loaded_tokenizer)
        tokenizers[name] = tokenizer
        folders += [str(tmp_path / name), str(tmp_path / f"{name}-minimind")]

    inputs = torch.randint(3, 6400, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.save(inputs, tmp_path / "inputs.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    proc = subprocess.run(
        [tf457_python, "-c", _LOADER, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt"),
         json.dumps([TEXT, MESSAGES]), *folders],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = torch.load(tmp_path / "out.pt", weights_only=False)

    for name, model in models.items():
        reference = tokenizers[name]
        for folder in (str(tmp_path / name), str(tmp_path / f"{name}-minimind")):
            got = results[folder]
            assert got["ids"] == reference(TEXT)["input_ids"], folder
            assert got["chat"] == reference.apply_chat_template(MESSAGES, tokenize=False), folder
        remote = results[str(tmp_path / f"{name}-minimind")]
        assert "needs transformers>=5.24, found 4.57.1" in remote["error"]

        exported = results[str(tmp_path / name)]
        architectures = json.loads((tmp_path / name / "config.json").read_text())["architectures"]
        assert exported["class"] == architectures[0]
        with torch.no_grad():
            expected = model(inputs).logits
            greedy = model.generate(inputs[:1], max_new_tokens=8, do_sample=False, min_new_tokens=8)
        torch.testing.assert_close(exported["logits"], expected, atol=1e-5, rtol=0)
        assert torch.equal(exported["greedy"], greedy), name
