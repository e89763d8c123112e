"""What a registered policy loss receives beyond the log-probs (issue 41): the policy's entropies, the reference's
log-probs and its own keyword arguments from the recipe (`loss_kwargs`, checked naming the key)."""

import copy
import json

import pytest
import torch
from datasets import Dataset

from minimind_trl.errors import RecipeError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.algorithm.policy_losses import (
    POLICY_LOSSES,
    LossKwarg,
    PolicyLossInputs,
    check_loss_kwargs,
    register_policy_loss,
)
from minimind_trl.trainer.algorithm.seam_choice import seam_rows
from minimind_trl.trainer.checks.config_ranges import Range
from trainer_fixtures import grpo_config, tiny_model

SEEN: list[PolicyLossInputs] = []


@pytest.fixture
def recording_loss(monkeypatch):
    """`recording_loss` registered (with two declared keyword arguments) for the test only; it keeps its inputs."""
    monkeypatch.setattr("minimind_trl.trainer.algorithm.policy_losses.POLICY_LOSSES", POLICY_LOSSES)
    saved = dict(POLICY_LOSSES)

    @register_policy_loss("recording_loss", loss_kwargs={"coef": LossKwarg(0.5, Range(0.0, 1.0)), "label": "x",
                                                         "count": LossKwarg(2, (1, None)),
                                                         "weights": LossKwarg([0.25, 0.75], (0, 1)), "extra": None})
    def recording(inputs: PolicyLossInputs):
        SEEN.append(inputs)
        return -inputs.advantages * inputs.per_token_logps

    SEEN.clear()
    yield recording
    POLICY_LOSSES.clear()
    POLICY_LOSSES.update(saved)


def config(tmp_path, **values):
    return MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **values)


def test_loss_kwargs_reach_the_config_as_declared_defaults_with_the_recipes_over_them(tmp_path, recording_loss):
    defaults = {"coef": 0.5, "label": "x", "count": 2, "weights": [0.25, 0.75], "extra": None}
    assert check_loss_kwargs(config(tmp_path, loss_type="recording_loss")) == defaults
    given = config(tmp_path, loss_type="recording_loss", loss_kwargs={"coef": 1})  # an int for a float: taken
    assert check_loss_kwargs(given) == {**defaults, "coef": 1.0}
    from_command_line = config(tmp_path, loss_type="recording_loss", loss_kwargs='{"label": "y"}')  # JSON
    assert from_command_line.loss_kwargs == {"label": "y"}
    assert check_loss_kwargs(from_command_line) == {**defaults, "label": "y"}
    rows = {key: name for key, name, _ in seam_rows(given)}
    assert rows["loss_type"] == f'recording_loss {json.dumps({**defaults, "coef": 1.0}, sort_keys=True)}'  # the card


def test_a_number_written_as_text_is_read_as_the_number(tmp_path, recording_loss):
    """YAML reads `1e-3` as a string; a loss's setting takes it as the parser takes a top-level `learning_rate:
    1e-3`, items of a list of numbers too."""
    given = config(tmp_path, loss_type="recording_loss",
                   loss_kwargs={"coef": "1e-3", "count": " 3 ", "weights": ["5e-1", 1], "extra": {"a": "1e-3"}})
    resolved = check_loss_kwargs(given)
    assert (resolved["coef"], resolved["count"], resolved["weights"]) == (0.001, 3, [0.5, 1.0])
    assert resolved["extra"] == {"a": "1e-3"}  # a setting declared without a type is taken as given


@pytest.mark.parametrize("text", ["{coef: 0.5}", "{'coef': 0.5}", '{"coef": 0.5'])
def test_loss_kwargs_text_that_is_not_json_names_the_key(tmp_path, recording_loss, text):
    """From Python (text as the command line gives it) and on the command line: one line naming the key or flag."""
    from minimind_trl.cli.recipe import parse_recipe

    with pytest.raises(RecipeError, match=r"^loss_kwargs is not JSON \(.*\): .* give a dict, or JSON text"):
        config(tmp_path, loss_type="recording_loss", loss_kwargs=text)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\nloss_type: recording_loss\n")
    for argv in (["--loss_kwargs", text], [f"--loss-kwargs={text}"]):
        flag = argv[0].partition("=")[0]
        with pytest.raises(RecipeError, match=rf"^{flag} .*: not JSON \(.*\); write it as {flag} '{{\"key\": 0.5}}'"):
            parse_recipe(str(recipe), argv)


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (LossKwarg(0.5, (1.0, 0.0)), r"with range \(1.0, 0.0\): a range is .* a \(low, high\) pair"),
        (LossKwarg(0.5, ("0", 1)), r"with range \('0', 1\): a range is"),
        (LossKwarg(0.5, (float("nan"), 1)), r"with range \(nan, 1\): a range is"),
        (LossKwarg(0.5, (0, 10**400)), r"with range \(0, 10000.*\.\.\. \(406 characters\)"),
        (LossKwarg(0.5, 1.0), r"with range 1.0: a range is"),
        (LossKwarg(0.5, (0.0, 0.1)), r"with default 0.5: must be between 0 and 0.1, got 0.5"),
        (LossKwarg(float("inf")), r"with default inf: must be finite"),
        (LossKwarg(10**400), r"with default an integer of about 401 digits: must fit in 64 bits"),
        (LossKwarg([1.0, float("nan")]), r"with default \[1.0, nan\]: must be finite"),
    ],
)
def test_a_declaration_that_cannot_be_read_is_refused_at_registration(declared, message):
    """A `(low, high)` pair is a range (None: unbounded); anything else that is not a range, and a default that does
    not fit its own declaration, is one `ExtensionError` naming the loss and the keyword."""
    from minimind_trl.errors import ExtensionError

    with pytest.raises(ExtensionError, match=r"policy loss 'declared' declares loss_kwargs 'coef' " + message):
        register_policy_loss("declared", loss_kwargs={"coef": declared})(lambda inputs: inputs)
    assert "declared" not in POLICY_LOSSES


@pytest.mark.parametrize(
    ("loss_type", "loss_kwargs", "message"),
    [
        ("recording_loss", {"cof": 0.1}, r"loss_kwargs key 'cof' is not a keyword argument .* declares: coef, label"),
        ("recording_loss", {"coef": "a tenth"}, r"loss_kwargs key 'coef' .* must be a float .* got str 'a tenth'"),
        ("recording_loss", {"coef": True}, r"loss_kwargs key 'coef' .* must be a float .* got bool"),
        ("recording_loss", {"coef": 1.5}, r"loss_kwargs key 'coef' .* must be between 0 and 1, got 1.5"),
        ("recording_loss", {"coef": "2e-0"}, r"loss_kwargs key 'coef' .* must be between 0 and 1, got 2.0"),
        ("recording_loss", {"coef": float("nan")}, r"loss_kwargs key 'coef' .* must be finite"),
        ("recording_loss", {"coef": "-inf"}, r"loss_kwargs key 'coef' .* must be finite, got -inf"),
        ("recording_loss", {"coef": 10**400}, r"loss_kwargs key 'coef' .* must fit in 64 bits.* about 401 digits"),
        ("recording_loss", {"count": -(10**5000)}, r"loss_kwargs key 'count' .* must fit in 64 bits.* 5001 digits"),
        ("recording_loss", {"count": "1e3"}, r"loss_kwargs key 'count' .* must be an int .* got str '1e3'"),
        ("recording_loss", {"weights": [0.5, float("nan")]}, r"loss_kwargs key 'weights' .* must be finite, got nan"),
        ("recording_loss", {"weights": [0.5, 10**400]}, r"loss_kwargs key 'weights' .* must fit in 64 bits"),
        ("recording_loss", {"weights": [0.5, 2]}, r"loss_kwargs key 'weights' .* must be between 0 and 1, got 2.0"),
        ("recording_loss", {"weights": [0.5, "x"]}, r"loss_kwargs key 'weights' .* list of float .* got 'x' in it"),
        ("recording_loss", {"weights": 0.5}, r"loss_kwargs key 'weights' .* must be a list .* got float 0.5"),
        ("recording_loss", {"extra": {"a": [float("inf")]}}, r"loss_kwargs key 'extra' .* must be finite, got inf"),
        ("recording_loss", {"label": 3}, r"loss_kwargs key 'label' .* must be a str"),
        ("minimind3_grpo", {"coef": 0.1}, r"loss_kwargs key 'coef' is not a keyword argument .* declares: none"),
        ("grpo", {"coef": 0.1}, r"TRL's loss_type 'grpo' takes no keyword arguments"),
    ],
)
def test_a_bad_loss_kwarg_is_refused_naming_the_key(tmp_path, recording_loss, loss_type, loss_kwargs, message):
    with pytest.raises(RecipeError, match=message):
        config(tmp_path, loss_type=loss_type, loss_kwargs=loss_kwargs)


def test_a_loss_declaring_a_default_of_the_wrong_kind_is_refused(recording_loss):
    from minimind_trl.errors import ExtensionError

    with pytest.raises(ExtensionError, match="declares loss_kwargs 'coef' with default -1.0: must be at least 0"):
        register_policy_loss("bad_default", loss_kwargs={"coef": LossKwarg(-1.0, Range(0.0))})(lambda inputs: inputs)


def test_entropy_coef_is_refused_for_a_registered_loss_saying_what_to_do_instead(tmp_path):
    with pytest.raises(ValueError, match=r"entropy_coef=0\.1 .* inputs\.entropies, its coefficient from loss_kwargs"):
        config(tmp_path, loss_type="minimind3_grpo", entropy_coef=0.1)


def _entropies_and_logps(model, input_ids, n_keep):
    with torch.no_grad():
        logits = model(input_ids, logits_to_keep=n_keep + 1).logits[:, :-1, :]
    log_probs = logits.log_softmax(-1)
    entropies = -(log_probs.exp() * log_probs).sum(-1)
    return entropies, torch.gather(log_probs, 2, input_ids[:, -n_keep:, None]).squeeze(-1)


def _trainer(tmp_path, initial, **values):
    tokenizer = build_minimind_tokenizer()
    rows = [{"prompt": f"Question {i // 4}: what now?"} for i in range(8)]
    args = grpo_config(tmp_path, loss_type="recording_loss", max_steps=1, save_strategy="no", **values)
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(initial), lambda completion_ids, **kw: [float(ids[0] % 5) for ids in completion_ids], args,
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    completions = [[7 + i, 9, 11 + i, 2] for i in range(8)]  # equal lengths, each ends with EOS: no padding
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: ([completions[i] for i in range(len(prompt_ids))], None)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer, trainer._generate_and_score_completions(rows)


def test_a_loss_receives_the_logged_entropies_the_reference_log_probs_and_its_kwargs(tmp_path, recording_loss):
    initial = tiny_model(build_minimind_tokenizer(), seed=3)
    trainer, inputs = _trainer(tmp_path, initial, beta=0.05, loss_kwargs={"coef": 0.25})
    with torch.no_grad():  # the policy moves away from the reference (a copy of `initial`)
        for parameter in trainer.model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    trainer.compute_loss(trainer.model, inputs)
    (seen,) = SEEN
    assert dict(seen.loss_kwargs) == {"coef": 0.25, "label": "x", "count": 2, "weights": [0.25, 0.75], "extra": None}
    with pytest.raises(TypeError):
        seen.loss_kwargs["coef"] = 1.0  # read-only: a loss cannot change the next micro-batch's coefficient

    logged = trainer._metrics["train"]["entropy"][-1]
    assert (seen.entropies * seen.mask).sum().item() / seen.mask.sum().item() == pytest.approx(logged, rel=1e-6)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    entropies, policy_logps = _entropies_and_logps(trainer.model, input_ids, 4)
    torch.testing.assert_close(seen.entropies.detach(), entropies, rtol=1e-5, atol=1e-5)
    assert seen.entropies.requires_grad  # an entropy bonus trains
    _, logps = _entropies_and_logps(initial, input_ids, 4)
    assert (logps - policy_logps).abs().max() > 1e-3  # the two forwards differ, so the test tells them apart
    torch.testing.assert_close(seen.ref_per_token_logps, logps, rtol=1e-5, atol=1e-5)  # the frozen reference's


def test_without_a_reference_the_loss_gets_none(tmp_path, recording_loss):
    trainer, inputs = _trainer(tmp_path, tiny_model(build_minimind_tokenizer()), beta=0.0)
    trainer.compute_loss(trainer.model, inputs)
    (seen,) = SEEN
    assert seen.ref_per_token_logps is None and seen.entropies is not None
    assert dict(seen.loss_kwargs)["coef"] == 0.5  # the declared defaults


def test_loss_kwargs_from_a_recipe_and_the_command_line(tmp_path, recording_loss):
    from minimind_trl.cli.recipe import parse_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\nloss_type: recording_loss\n"
                      "loss_kwargs: {coef: 0.75}\n")
    _, training_args, _, _ = parse_recipe(str(recipe))
    assert check_loss_kwargs(training_args)["coef"] == 0.75
    _, training_args, _, _ = parse_recipe(str(recipe), ["--loss_kwargs", json.dumps({"label": "z"})])
    assert check_loss_kwargs(training_args)["label"] == "z"
    recipe.write_text(recipe.read_text().replace("{coef: 0.75}", "{coef: 1e-3, weights: [1e-1, 2e-1]}"))  # strings
    _, training_args, _, _ = parse_recipe(str(recipe))
    assert (check_loss_kwargs(training_args)["coef"], check_loss_kwargs(training_args)["weights"]) == (1e-3, [0.1, 0.2])
    with pytest.raises(RecipeError, match="loss_kwargs key 'coef'"):
        parse_recipe(str(recipe), ["--loss_kwargs", '{"coef": -1}'])
