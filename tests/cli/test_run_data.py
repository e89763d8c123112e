"""The run's prompts (`minimind_trl.cli.run_data`): TRL's dataset mixtures read through MiniMind's loaders (the rows
TRL's `get_dataset` keeps, the same row checks), splits asked of a source that lacks them, and every data option
refused before a model loads, in one line naming the key. Evaluation on the held-out prompts themselves is
tests/cli/test_evaluation.py."""

from types import SimpleNamespace

import pytest
import yaml
from grpo_fixtures import PROMPTS, agent_rows, build_tiny_policy, tiny_recipe, write_rlaif, write_rows
from test_grpo_cli import refuse_model_loading
from trl import DatasetMixtureConfig, get_dataset
from trl.scripts.utils import DatasetConfig

from minimind_trl.cli import main as cli
from minimind_trl.cli.run_data import PromptSources, load_mixture, mixture_sizes, prompt_sources
from minimind_trl.cli.script_args import GRPOScriptArguments
from minimind_trl.errors import AgentDataError, RLAIFDataError


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One RLAIF file (one split), a folder of train.jsonl and test.jsonl (two splits), a second file and one whose
    second line is bad."""
    root = tmp_path_factory.mktemp("sources")
    (root / "folder").mkdir()
    write_rlaif(root / "folder" / "train.jsonl", PROMPTS[:6])
    write_rlaif(root / "folder" / "test.jsonl", PROMPTS[6:])
    bad = root / "bad.jsonl"
    bad.write_text(write_rlaif(root / "one.jsonl", PROMPTS[:1]).read_text() + '{"conversations": []}\n')
    return {"file": write_rlaif(root / "rlaif.jsonl"), "folder": root / "folder",
            "small": write_rlaif(root / "small.jsonl", PROMPTS[:3]), "bad": bad}


def mixture(*paths, **entry) -> list[dict]:
    return [{"path": str(path), **entry} for path in paths]


# (recipe changes, command-line flags, what the one error line says); "{file}" etc. name `sources`
REFUSED = {
    "no test split in a file": (
        {}, ["--eval_strategy", "steps"],
        "dataset_test_split='test': {file} has no split 'test' (its splits: train); held-out prompts are",
    ),
    "no such split in a folder": (
        {"dataset_name": "{folder}"}, ["--eval_strategy", "steps", "--dataset_test_split", "validation"],
        "dataset_test_split='validation': {folder} has no split 'validation' (its splits: train, test)",
    ),
    "a file's training split": ({}, ["--dataset_train_split", "training"], "dataset_train_split='training': {file}"),
    "a held-out file without evaluation": ({}, ["--eval_dataset_name", "{small}"], "eval_dataset_name={small}"),
    "a missing held-out file": (
        {}, ["--eval_strategy", "steps", "--eval_dataset_name", "nowhere/held.jsonl"],
        "eval_dataset_name: data file nowhere/held.jsonl does not exist",
    ),
    "streaming": ({}, ["--dataset_streaming", "true"], "dataset_streaming: true is not supported"),
    "a streamed mixture": (
        {"dataset_name": None, "datasets": mixture("{file}"), "streaming": True}, [], "streaming: true is not supported"
    ),
    "a mixture and dataset_name": ({"datasets": mixture("{file}")}, [], "datasets: (a mixture) and dataset_name="),
    "an unknown entry key": (
        {"dataset_name": None, "datasets": mixture("{file}", paht="x")}, [], "datasets[0]: unknown key(s) paht"
    ),
    "an entry without a path": (
        {"dataset_name": None, "datasets": [{"split": "train"}]}, [], "datasets[0]: needs a path"
    ),
    "a missing entry": (
        {"dataset_name": None, "datasets": mixture("{file}", "nowhere.jsonl")}, [], "datasets[1].path: data file"
    ),
    "an entry's configuration": (
        {"dataset_name": None, "datasets": mixture("{file}", name="default")}, [], "datasets[0].name='default'"
    ),
    "columns the rows are not read from": (
        {"dataset_name": None, "datasets": mixture("{file}", columns=["prompt"])}, [], "datasets[0].columns=['prompt']"
    ),
    "fractions on some entries": (
        {"dataset_name": None, "datasets": mixture("{file}", fraction=0.5) + mixture("{small}")}, [],
        "fraction must be set for either all entries",
    ),
    "dataset_data_files with a mixture": (
        {"dataset_name": None, "datasets": mixture("{file}"), "dataset_data_files": "x.jsonl"}, [],
        "dataset_data_files='x.jsonl' reads dataset_name",
    ),
    "test_split_size without a mixture": ({"test_split_size": 0.25}, [], "test_split_size=0.25 holds out rows"),
    "a mixture without a test split": (
        {"dataset_name": None, "datasets": mixture("{file}")}, ["--eval_strategy", "steps"],
        "dataset_test_split='test': the datasets mixture has no split 'test' (its splits: train)",
    ),
    "a test split of no rows": ({"dataset_name": None, "datasets": mixture("{file}"), "test_split_size": 0.0}, [],
                                "test_split_size: must be a positive number or unset"),
    "a test split of every row": (
        {"dataset_name": None, "datasets": mixture("{file}"), "test_split_size": 100}, [], "test_split_size=100: ",
    ),
    "an entry's missing split": (
        {"dataset_name": None, "datasets": mixture("{folder}", split="validation")}, [],
        "datasets[0].split='validation': {folder} has no split 'validation' (its splits: train, test)",
    ),
    "an output_dir inside the held-out data": (
        {"output_dir": "{folder}/out"}, ["--eval_strategy", "steps", "--eval_dataset_name", "{folder}"],
        "output_dir {folder}/out lies inside the input eval_dataset_name {folder}",
    ),
    "an output_dir inside a mixture's data": (
        {"dataset_name": None, "datasets": mixture("{file}", "{folder}"), "output_dir": "{folder}/out"}, [],
        "output_dir {folder}/out lies inside the input datasets[1].path {folder}",
    ),
    "a bad row in a mixture's second file": (
        {"dataset_name": None, "datasets": mixture("{file}", "{bad}")}, [], "{bad}:2: empty conversation",
    ),
}


@pytest.mark.parametrize("changes, flags, message", REFUSED.values(), ids=REFUSED.keys())
def test_data_options_are_refused_in_one_line_before_a_model_loads(
    tmp_path, policy, sources, monkeypatch, capsys, changes, flags, message
):
    def named(value):
        return value.format(**sources) if isinstance(value, str) else value

    recipe = yaml.safe_load(tiny_recipe(tmp_path, policy, sources["file"]).read_text())
    for key, value in changes.items():
        entries = key == "datasets"
        recipe[key] = [{k: named(v) for k, v in entry.items()} for entry in value] if entries else named(value)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    refuse_model_loading(monkeypatch)
    assert cli(["grpo", "--config", str(path), *map(named, flags)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("minimind-trl grpo: error: ")]  # datasets' bars too
    assert len(errors) == 1 and named(message) in errors[0] and "Traceback" not in err, err


def script_args(entries, **settings) -> GRPOScriptArguments:
    return GRPOScriptArguments(datasets=entries, **settings)


def mixture_sources(args: GRPOScriptArguments, seed: int) -> PromptSources:
    """What the run plan derives from `args` for loading, in a run with `seed` that does not evaluate."""
    return prompt_sources(args, SimpleNamespace(eval_strategy="no", seed=seed))


@pytest.mark.parametrize("fractions", [None, (0.75, 0.25), (1.0, 3.0), (0.0, 1.0)])
def test_a_mixture_keeps_the_rows_trls_get_dataset_keeps(sources, fractions):
    """The same files through TRL's `get_dataset` (raw rows) and through the run's loaders (prompts): the same rows,
    in the same order, for every way of sharing (none, shares, shares to normalise, a part left out)."""
    paths = (sources["file"], sources["small"])
    shares = fractions or (None, None)
    trl_mixture = get_dataset(DatasetMixtureConfig(datasets=[
        DatasetConfig(path="json", data_files=str(path), fraction=share) for path, share in zip(paths, shares)
    ]))["train"]
    args = script_args([{"path": str(path), "fraction": share} for path, share in zip(paths, shares)])
    ours = load_mixture(mixture_sources(args, 0))
    assert [row["prompt"][-1]["content"] for row in ours["train"]] == [
        row["conversations"][0]["content"] for row in trl_mixture
    ]
    assert list(ours) == ["train"]


def test_mixture_sizes_are_trls_rule():
    assert mixture_sizes([8, 3], [0.75, 0.25]) == [8, 3]  # the mixture as large as no repeated row allows
    assert mixture_sizes([8, 3], [0.5, 0.5]) == [3, 3]
    assert mixture_sizes([8, 3], [0.0, 1.0]) == [0, 3]


def test_a_held_out_share_is_drawn_with_the_seed(sources):
    """`test_split_size` holds out the same rows for the same seed (a resume trains on the same rows), others for
    another seed; train and test together are the mixture."""
    args = script_args(mixture(sources["file"], sources["small"]), test_split_size=0.25)
    first, again, other = (load_mixture(mixture_sources(args, seed)) for seed in (0, 0, 1))
    assert sorted(first) == ["test", "train"] and (len(first["train"]), len(first["test"])) == (8, 3)
    assert first["test"]._fingerprint == again["test"]._fingerprint
    assert first["test"].to_list() == again["test"].to_list() and first["test"].to_list() != other["test"].to_list()


def test_a_mixtures_splits_are_checked_by_the_plan_and_read_by_loading(sources):
    """A split the mixture lacks is refused before a row loads (even a bad row); loading reads the split the plan
    checked, and no split (None) is the mixture's only one."""
    from minimind_trl.cli.run_data import check_data_sources, load_run_data

    training_args = SimpleNamespace(eval_strategy="no", seed=0)
    unread = script_args(mixture(sources["bad"]), dataset_train_split="validation")
    with pytest.raises(ValueError, match=r"^dataset_train_split='validation': the datasets mixture has no split"):
        check_data_sources(unread, training_args)
    only = script_args(mixture(sources["small"]), dataset_train_split=None)
    check_data_sources(only, training_args)
    assert len(load_run_data(prompt_sources(only, training_args)).train) == 3


def test_an_agent_mixture_reads_agent_rows_and_checks_each_file(tmp_path):
    """With `rollout: agent` every entry goes through the agent loader (tools and gt columns); a bad row names its
    file and line."""
    first = write_rows(tmp_path / "a.jsonl", agent_rows(3))
    second = write_rows(tmp_path / "b.jsonl", agent_rows(2))
    args = script_args(mixture(first, second), rollout="agent")
    loaded = load_mixture(mixture_sources(args, 0))["train"]
    assert loaded.column_names == ["prompt", "tools", "gt"] and len(loaded) == 5
    assert [row["gt"] for row in loaded] == [f'["{row["gt"][0]}"]' for row in agent_rows(3) + agent_rows(2)]
    without_gt = {key: value for key, value in agent_rows(1)[0].items() if key != "gt"}
    write_rows(tmp_path / "b.jsonl", [without_gt])
    with pytest.raises(AgentDataError, match=rf"^{tmp_path / 'b.jsonl'}:1: "):
        load_mixture(mixture_sources(args, 0))


def test_a_file_has_one_split_and_a_folder_those_datasets_finds(sources):
    from minimind_trl.data import load_rlaif_dataset

    with pytest.raises(RLAIFDataError, match=r"has no split 'test' \(its splits: train\)$"):
        load_rlaif_dataset(sources["file"], split="test")
    assert len(load_rlaif_dataset(sources["file"], split=None)) == len(PROMPTS)  # None: the only split
    assert len(load_rlaif_dataset(sources["folder"], split="test")) == 2
    with pytest.raises(RLAIFDataError, match=r"has several splits \(its splits: train, test\)$"):
        load_rlaif_dataset(sources["folder"], split=None)


def test_the_documented_recipes_read_as_documented(tmp_path, policy, sources):
    """docs/training.md's two recipe blocks, read from the page: the mixture (its files replaced by two of ours)
    keeps TRL's rows and holds `test_split_size` out; the evaluation block takes a folder's test split."""
    from doc_blocks import doc_blocks

    from minimind_trl.cli.run_data import load_run_data
    from minimind_trl.grpo import parse_args

    (mix_block,) = doc_blocks("training.md", "Splits, mixtures and TRL's other dataset options", "yaml", 1)
    (eval_block,) = doc_blocks("training.md", "Evaluation during training", "yaml", 1)
    mix_block = mix_block.replace("dataset/rlaif-mini.jsonl", str(sources["file"]))
    mix_block = mix_block.replace("dataset/chat.jsonl", str(sources["small"]))

    def parsed(block, **changes):
        recipe = yaml.safe_load(tiny_recipe(tmp_path, policy, sources["folder"]).read_text())
        recipe.update(yaml.safe_load(block), **changes)
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe))
        return parse_args(["--config", str(path)])

    script_args, training_args, _, _ = parsed(mix_block, eval_strategy="steps")
    data = load_run_data(prompt_sources(script_args, training_args))
    assert (len(data.train), len(data.eval)) == (10, 1)  # 8 + 3 rows (TRL's rule at 3:1), 5 % held out
    script_args, training_args, _, _ = parsed(eval_block)
    data = load_run_data(prompt_sources(script_args, training_args))
    assert [row["prompt"][-1]["content"] for row in data.eval] == PROMPTS[6:]


def test_held_out_agent_rows_offering_a_tool_the_run_lacks_are_refused_before_the_policy_loads(
    tmp_path, monkeypatch, capsys
):
    """The held-out rows pass the training rows' checks, the agent's offered tools included: a held-out row that
    offers a tool `agent_tools` does not run would be scored invalid at every call."""
    import json

    from grpo_fixtures import CALCULATOR
    from test_agent_recipe import agent_argv

    from minimind_trl.demos.model import build_tokenizer, save_folder
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model
    from minimind_trl.models.minimind.tiny import tiny_minimind_model

    tokenizer = build_tokenizer("minimind3")
    policy = save_folder(tiny_minimind_model(len(tokenizer), "minimind3"), tokenizer, tmp_path / "policy")
    reward_model = write_tiny_internlm2_reward_model(tmp_path / "rm")
    converter = {"type": "function", "function": {**CALCULATOR["function"], "name": "unit_converter"}}
    held_out = agent_rows(2)
    held_out[1]["conversations"][0]["tools"] = json.dumps([CALCULATOR, converter])
    argv = agent_argv(policy, reward_model, write_rows(tmp_path / "train.jsonl", agent_rows(4)), tmp_path / "out",
                      "--agent_tools", "calculate_math", "--eval_strategy", "steps", "--eval_dataset_name",
                      write_rows(tmp_path / "held.jsonl", held_out))
    refuse_model_loading(monkeypatch)
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"minimind-trl grpo: error: {tmp_path / 'held.jsonl'}: its rows' tool schemas offer")
    assert "'unit_converter' (row 1 of 2)" in err[-1]
