"""The trainer's seams (`seams.py`, `seam_choice.py`): a `package.module:function` value is imported, checked and
registered when the config is built; a bad one is one error line naming the key and the value; registration
refuses names that could not be picked back."""

import pytest
from grpo_fixtures import saved_registries, write_toy_seams

from minimind_trl.errors import ExtensionError
from minimind_trl.trainer import MiniMindGRPOConfig
from minimind_trl.trainer.algorithm.advantages import ADVANTAGE_ESTIMATORS, register_adv_est
from minimind_trl.trainer.algorithm.loss_aggregation import LOSS_AGGREGATIONS, register_loss_aggregation
from minimind_trl.trainer.algorithm.policy_losses import POLICY_LOSSES, register_policy_loss
from minimind_trl.trainer.algorithm.seam_choice import seam_rows, seam_run_identity


@pytest.fixture
def registries():
    with saved_registries():
        yield


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A folder outside the package on the import path (and the imports it leads to forgotten afterwards)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def config(tmp_path, **values):
    return MiniMindGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, **values)


@pytest.mark.parametrize("register", [register_policy_loss, register_adv_est, register_loss_aggregation])
@pytest.mark.parametrize("name", ["", "  ", None, 3])
def test_registration_refuses_a_name_that_is_not_a_non_empty_string(registries, register, name):
    with pytest.raises(ExtensionError, match="name must be a non-empty string"):
        register(name)(lambda *args: None)


def test_module_functions_are_imported_registered_and_named_when_the_config_is_built(registries, module_dir, tmp_path):
    values = write_toy_seams(module_dir, "toy_seams_config")
    args = config(tmp_path, **values)
    import toy_seams_config

    assert POLICY_LOSSES[values["loss_type"]] is toy_seams_config.reinforce
    assert ADVANTAGE_ESTIMATORS[values["advantage_estimator"]] is toy_seams_config.group_rank
    assert LOSS_AGGREGATIONS[values["loss_aggregation"]] is toy_seams_config.token_mean
    assert seam_rows(args) == [
        ("advantage_estimator", "toy_seams_config:group_rank", "toy_seams_config:group_rank"),
        ("loss_type", "toy_seams_config:reinforce", "toy_seams_config:reinforce"),
        ("loss_aggregation", "toy_seams_config:token_mean", "toy_seams_config:token_mean"),
    ]
    builtin = config(tmp_path, loss_type="minimind3_grpo")  # TRL's and the built-in ones named as they run
    assert seam_run_identity(builtin) == {
        "advantage_estimator_function": "minimind_trl.trainer.algorithm.advantages:minimind_estimator",
        "loss_type_function": "minimind_trl.trainer.algorithm.policy_losses:minimind3_grpo",
        "loss_aggregation_function": "minimind_trl.trainer.algorithm.loss_aggregation:seq_mean_token_mean",
    }
    assert seam_run_identity(config(tmp_path))["loss_type_function"] == "trl:GRPOTrainer (grpo)"


COLLIDING = {
    "taken": (
        "from minimind_trl.trainer.algorithm.policy_losses import register_policy_loss\n"
        "@register_policy_loss('minimind3_cispo')\ndef mine(inputs):\n    return -inputs.per_token_logps\n",
        "policy loss 'minimind3_cispo' is already registered",
    ),
    "trl": (
        "from minimind_trl.trainer.algorithm.advantages import register_adv_est\n"
        "@register_adv_est('trl')\ndef mine(inputs):\n    return inputs.rewards\n",
        "reserved for TRL's own advantages",
    ),
}


@pytest.mark.parametrize(
    "key, value, problem",
    [
        ("loss_type", "toy_missing_module_xyz:reinforce", "cannot import module 'toy_missing_module_xyz'"),
        ("advantage_estimator", "{toy}:no_such_estimator", "has no attribute 'no_such_estimator'"),
        ("loss_aggregation", "{toy}:reinforce", "a loss aggregation's arguments (per_token_loss, mask, scale)"),
        ("loss_type", "{toy}:two_arguments", "cannot be called with a policy loss's arguments (inputs)"),
        ("advantage_estimator", "{toy}:NOT_A_FUNCTION", "is not callable"),
        ("loss_type", "toy_collides_taken:mine", COLLIDING["taken"][1]),
        ("advantage_estimator", "toy_collides_trl:mine", COLLIDING["trl"][1]),
        # these pass a signature check, then would die at step 1 with a raw TypeError
        ("loss_type", "os:system", "built into Python or an extension"),
        ("advantage_estimator", "builtins:print", "built into Python or an extension"),
        ("loss_aggregation", "builtins:max", "built into Python or an extension"),
        ("loss_aggregation", "collections:OrderedDict", "is a class"),
        ("loss_type", "toy_generator_seam:losses", "generator or coroutine function"),
    ],
)
def test_each_bad_value_is_one_error_naming_the_key_and_the_value(registries, module_dir, tmp_path, key, value,
                                                                   problem):
    write_toy_seams(module_dir, f"toy_seams_bad_{key}")
    for name, (source, _) in COLLIDING.items():
        (module_dir / f"toy_collides_{name}.py").write_text(source)
    (module_dir / "toy_generator_seam.py").write_text("def losses(inputs):\n    yield -inputs.per_token_logps\n")
    value = value.format(toy=f"toy_seams_bad_{key}")
    with pytest.raises(ExtensionError) as error:
        config(tmp_path, **{key: value})
    message = str(error.value)
    assert message.startswith(f"{key} {value!r}: ") and problem in message and "\n" not in message
    assert value not in POLICY_LOSSES and value not in ADVANTAGE_ESTIMATORS and value not in LOSS_AGGREGATIONS


def test_a_registered_name_that_looks_like_a_module_path_is_not_imported(registries, tmp_path):
    register_policy_loss("my.loss")(lambda inputs: -inputs.per_token_logps)
    assert config(tmp_path, loss_type="my.loss").loss_type == "my.loss"
