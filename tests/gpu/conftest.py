"""The `gpu` tests: their bodies run on the device `MINIMIND_TEST_DEVICE` names (default `cuda`), and skip, saying why,
where that is CUDA and no CUDA device is visible. `MINIMIND_TEST_DEVICE=cpu` runs the same bodies on CPU at the same
sizes (how each was seen to fail with its guarded behaviour broken on purpose; `benchmarks/gpu_check.sh --cpu`)."""

import pytest
from gpu_harness import chosen_device


@pytest.fixture
def device() -> str:
    name = chosen_device()
    if name == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device (MINIMIND_TEST_DEVICE=cpu runs this body on CPU)")
    return name
