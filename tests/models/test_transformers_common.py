"""transformers' own common model tests (ModelTesterMixin, GenerationTesterMixin, CausalLMModelTest, ConfigTester,
training and export mixins), run against MiniMind the way an in-tree model wires them up.

The suite is transformers' code, kept in ../shared/transformers-tests (see its README) and imported from there, never
copied here. It fails under CI=true when that folder is missing and skips elsewhere. Every skip comes from the
suite's own decorators and checks (GPU, Hub, `@slow`, missing optional packages, features MiniMind lacks), with one
exception: the experts test (eager vs `batched_mm` / `grouped_mm`) is skipped for the dense variants, which have no
experts to dispatch. transformers decides experts support per modeling file (the `@use_experts_implementation` text),
and dense and MoE MiniMind share one file; `test_dense_variants_have_no_experts_to_dispatch` checks the reason holds.
"""

import atexit
import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

import pytest
from conftest import SHARED

import transformers
from transformers.models.auto import modeling_auto

import minimind_trl  # noqa: F401  (registers MiniMind with the Auto classes)
from minimind_trl import (
    MiniMindConfig,
    MiniMindForCausalLM,
    MiniMindForQuestionAnswering,
    MiniMindForSequenceClassification,
    MiniMindForTokenClassification,
    MiniMindModel,
)

HF_TESTS = SHARED / "transformers-tests"


def _suite_root() -> Path:
    """A folder holding `tests` (the shared suite) and `src/transformers` (the installed package): the layout of a
    transformers checkout, which `test_pipeline_mixin.py` expects next to its own files."""
    if not (HF_TESTS / "tests" / "causal_lm_tester.py").is_file():
        message = f"{HF_TESTS} is missing (set MINIMIND_SHARED to the folder holding transformers-tests/)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message, allow_module_level=True)
    root = Path(tempfile.mkdtemp(prefix="minimind-hf-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # removes the links, not what they point to
    (root / "src").mkdir()
    (root / "src" / "transformers").symlink_to(Path(transformers.__file__).parent)
    (root / "tests").symlink_to(HF_TESTS / "tests")
    return root


sys.path.insert(0, str(_suite_root()))

from parameterized import parameterized  # noqa: E402
from tests.causal_lm_tester import CausalLMModelTest, CausalLMModelTester  # noqa: E402
from tests.test_modeling_common import TEST_EAGER_MATCHES_BATCHED_AND_GROUPED_INFERENCE_PARAMETERIZATION  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded_dummy_inputs():
    """transformers' testers draw dummy inputs from an unseeded module-level `random.Random` (`global_rng`), so
    each run tests different ids; seed it per test, as `torch` is (tests/conftest.py), so a run is reproducible."""
    from tests import test_modeling_common

    test_modeling_common.global_rng.seed(0)
    yield


@pytest.fixture(autouse=True, scope="module")
def _minimind_in_transformers_name_tables():
    """Several common tests find a model's role by its model type in transformers' auto-model name tables."""
    tables = [
        (modeling_auto.MODEL_MAPPING_NAMES, "MiniMindModel"),
        (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "MiniMindForCausalLM"),
        (modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "MiniMindForSequenceClassification"),
        (modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES, "MiniMindForTokenClassification"),
        (modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES, "MiniMindForQuestionAnswering"),
    ]
    added = [table for table, _ in tables if "minimind" not in table]
    for table, name in tables:
        table.setdefault("minimind", name)
    yield
    for table in added:
        del table["minimind"]


class MiniMindModelTester(CausalLMModelTester):
    """transformers' tiny text-model sizes; the subclasses pick the MiniMind variant."""

    # the tester infers classes only from names `transformers` itself exports, so name them all
    base_model_class = MiniMindModel
    config_class = MiniMindConfig
    causal_lm_class = MiniMindForCausalLM
    sequence_classification_class = MiniMindForSequenceClassification
    token_classification_class = MiniMindForTokenClassification
    question_answering_class = MiniMindForQuestionAnswering
    variant: dict = {}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **{**self.variant, **kwargs})


class MiniMind2DenseTester(MiniMindModelTester):
    variant = {"minimind_generation": "minimind2", "tie_word_embeddings": False}


class _BackboneAndLMTester(MiniMindModelTester):
    """The generic heads are one code path for every variant (tested with dense MiniMind2 above); the other variants
    run the suite on the backbone and the LM only, which keeps the module within a few minutes of CI."""

    sequence_classification_class = token_classification_class = question_answering_class = None


class MiniMind2MoeTester(_BackboneAndLMTester):
    variant = {
        "minimind_generation": "minimind2",
        "tie_word_embeddings": False,
        "use_moe": True,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
    }


class MiniMind3DenseTester(_BackboneAndLMTester):
    # head_dim 16 while hidden_size / num_attention_heads is 32 / 4 = 8
    variant = {"minimind_generation": "minimind3", "tie_word_embeddings": True, "num_attention_heads": 4, "head_dim": 16}


class MiniMind3MoeTester(_BackboneAndLMTester):
    variant = {
        "minimind_generation": "minimind3",
        "tie_word_embeddings": True,
        "use_moe": True,
        "num_experts": 4,
        "num_experts_per_tok": 1,
        "n_shared_experts": 0,
    }


class _DenseModelTest(CausalLMModelTest):
    """A dense variant: the same modeling file as MoE (so transformers offers it the experts implementations), but
    no experts module for any of them to run."""

    @parameterized.expand(TEST_EAGER_MATCHES_BATCHED_AND_GROUPED_INFERENCE_PARAMETERIZATION)
    def test_eager_matches_batched_and_grouped_inference(self, name, dtype):
        self.skipTest("dense MiniMind has no experts (test_dense_variants_have_no_experts_to_dispatch)")


class MiniMind2DenseModelTest(_DenseModelTest, unittest.TestCase):
    model_tester_class = MiniMind2DenseTester


class MiniMind2MoeModelTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = MiniMind2MoeTester


class MiniMind3DenseModelTest(_DenseModelTest, unittest.TestCase):
    model_tester_class = MiniMind3DenseTester


class MiniMind3MoeModelTest(CausalLMModelTest, unittest.TestCase):
    model_tester_class = MiniMind3MoeTester


def test_testers_build_the_variants_they_name():
    """The common tests exercise what the class names promise (a tester silently falling back to defaults would
    test dense untied MiniMind2 four times)."""
    configs = {
        cls.__name__: cls.model_tester_class(None).get_config()
        for cls in (MiniMind2DenseModelTest, MiniMind2MoeModelTest, MiniMind3DenseModelTest, MiniMind3MoeModelTest)
    }
    summary = {
        name: (c.minimind_generation, c.use_moe, c.tie_word_embeddings, c.num_experts_per_tok if c.use_moe else None,
               c.n_shared_experts if c.use_moe else None, c.head_dim, c.hidden_size // c.num_attention_heads)
        for name, c in configs.items()
    }  # fmt: skip
    assert summary == {
        "MiniMind2DenseModelTest": ("minimind2", False, False, None, None, 16, 16),
        "MiniMind2MoeModelTest": ("minimind2", True, False, 2, 1, 16, 16),
        "MiniMind3DenseModelTest": ("minimind3", False, True, None, None, 16, 8),
        "MiniMind3MoeModelTest": ("minimind3", True, True, 1, 0, 16, 16),
    }
    heads = {cls.__name__ for cls in MiniMind2DenseTester(None).all_model_classes}
    assert heads == {"MiniMindModel", "MiniMindForCausalLM", "MiniMindForSequenceClassification",
                     "MiniMindForTokenClassification", "MiniMindForQuestionAnswering"}  # fmt: skip


def test_auto_classes_load_the_generic_heads_from_a_minimind_folder(tmp_path):
    """TRL's RewardTrainer and value models load `AutoModelForSequenceClassification` from a policy folder."""
    import torch
    from transformers import (
        AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    config = MiniMind3DenseTester(None).get_config()
    policy = MiniMindForCausalLM(config)
    policy.save_pretrained(tmp_path)
    for auto_class, head_class in (
        (AutoModelForSequenceClassification, MiniMindForSequenceClassification),
        (AutoModelForTokenClassification, MiniMindForTokenClassification),
        (AutoModelForQuestionAnswering, MiniMindForQuestionAnswering),
    ):
        head, info = auto_class.from_pretrained(tmp_path, num_labels=1, output_loading_info=True)
        assert type(head) is head_class
        torch.testing.assert_close(head.model.layers[0].self_attn.q_proj.weight, policy.model.layers[0].self_attn.q_proj.weight)
    reward = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=1).eval()
    input_ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])  # right-padded with pad_token_id 0
    assert reward(input_ids).logits.shape == (2, 1)


@pytest.mark.parametrize("tester", [MiniMind2DenseTester, MiniMind3DenseTester])
def test_dense_variants_have_no_experts_to_dispatch(tester):
    """Why the experts test is skipped for them: no module takes transformers' experts call, and asking for another
    experts implementation is accepted and computes the same."""
    import torch

    from minimind_trl.models.minimind.feed_forward_minimind import MiniMindExperts

    config, inputs = tester(None).prepare_config_and_inputs_for_common()
    model = MiniMindForCausalLM(config).eval()
    assert not any(isinstance(module, MiniMindExperts) for module in model.modules())
    with torch.no_grad():
        eager = model(**inputs).logits
        model.set_experts_implementation("batched_mm")
        assert model.config._experts_implementation == "batched_mm"
        torch.testing.assert_close(model(**inputs).logits, eager, rtol=0, atol=0)


def test_moe_experts_default_to_upstreams_loop_and_take_transformers_kernels_on_request():
    """MiniMind's experts run upstream's loop by default (transformers would pick `grouped_mm`), and transformers'
    kernels compute the same on request (the common suite's experts test compares all three per variant)."""
    import torch

    config, inputs = MiniMind2MoeTester(None).prepare_config_and_inputs_for_common()
    model = MiniMindForCausalLM(config).eval()
    assert model.config._experts_implementation == "eager"
    with torch.no_grad():
        eager = model(**inputs).logits
        for implementation in ("grouped_mm", "batched_mm"):
            model.set_experts_implementation(implementation)
            torch.testing.assert_close(model(**inputs).logits, eager, rtol=1e-5, atol=1e-5)
