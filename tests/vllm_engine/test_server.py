"""`trl vllm-serve`'s server on localhost, on a MiniMind folder: the plugin loads in the server's processes and TRL's
client generates transformers' greedy tokens from it. Weight sync to a server needs CUDA (TRL 1.16 uses vLLM's NCCL
weight-transfer engine), so on CPU the trainer refuses server mode (tests/trainer/rollouts/test_vllm_rollouts.py)."""

import pytest
from vllm_support import _vllm_installed, run_scenario  # noqa: F401  (the fixture skips or fails without vLLM)

pytestmark = pytest.mark.vllm


def test_server_mode_on_localhost(tmp_path):
    result = run_scenario("server", tmp_path, "minimind3-moe")
    assert result["greedy_equal"], result
    assert result["has_logprobs"] and result["logprobs_mode"] == "raw_logprobs" and result["dtype"] == "torch.float32"
    assert result["communicator"].startswith("NotImplementedError") and "CUDA" in result["communicator"]
