"""`--push_to_hub`: what reaches the Hub (intercepted at huggingface_hub's upload API; no network) and the
model card; the pushed folder loads without minimind-trl. A Hub that cannot be reached stops the run before any
model loads, in one line; one that refuses the uploads (a local stand-in at HF_ENDPOINT) leaves every local output
complete, each failed push reported once, a summary, and exit status 3."""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import free_port
from grpo_fixtures import PROMPTS, build_tiny_policy, subprocess_env, tiny_recipe, write_rlaif
from hub_stand_in import HubStandIn, in_process_hub
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.utils import filter_repo_objects
from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

from minimind_trl.errors import PUSH_FAILED_EXIT_CODE
from minimind_trl.grpo import main
from minimind_trl.cli.hub import PushCheckError, check_push_folder
from minimind_trl.hub_uploads import OUTPUT_FOLDER_IGNORE
from minimind_trl.trainer.outputs.output_dir import FinalOutputs
from minimind_trl.trainer.outputs.model_card import final_metrics

HUB_ID = "someone/minimind-grpo-tiny"
FINAL_FILES = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "configuration_minimind.py",
    "feed_forward_minimind.py",
    "generation_config.json",
    "grpo_32.config.json",
    "grpo_32.pth",
    "model.safetensors",
    "modeling_minimind.py",
    "shared_prefix_minimind.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_args.bin",
}


class FakeHub:
    """Stands in for `HfApi.create_repo` / `HfApi.upload_folder`: computes the files an upload would send (the
    same pattern filtering as huggingface_hub) and copies them into a local "repo" per call."""

    def __init__(self, root: Path):
        self.root = root
        self.repos, self.uploads = [], []

    def create_repo(self, api, repo_id, **kwargs):
        from huggingface_hub import RepoUrl

        self.repos.append(repo_id)
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, api, *, repo_id, folder_path, path_in_repo=None, ignore_patterns=None, **kwargs):
        folder = Path(folder_path)
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        ignore = list(ignore_patterns or []) + DEFAULT_IGNORE_PATTERNS
        sent = sorted(filter_repo_objects(files, allow_patterns=kwargs.get("allow_patterns"), ignore_patterns=ignore))
        snapshot = self.root / f"upload-{len(self.uploads)}"
        for name in sent:
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(folder / name, snapshot / name)
        self.uploads.append(
            SimpleNamespace(
                repo_id=repo_id, folder=str(folder), path_in_repo=path_in_repo or "", files=sent, snapshot=snapshot,
                ignore_patterns=ignore_patterns,
            )
        )
        if kwargs.get("run_as_future"):
            future = Future()
            future.set_result(None)
            return future
        return None


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    policy = build_tiny_policy(root / "policy")
    data = write_rlaif(root / "rlaif.jsonl")
    recipe = tiny_recipe(
        root,
        policy,
        data,
        reward_weights=[1.0, 0.5, 2.0],
        save_strategy="steps",
        save_steps=1,
        push_to_hub=True,
        hub_model_id=HUB_ID,
        hub_strategy="checkpoint",
        save_native_pth=True,
    )
    hub = FakeHub(root / "fake-hub")
    patch = pytest.MonkeyPatch()
    patch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: hub.create_repo(api, repo_id, **kw))
    patch.setattr(HfApi, "upload_folder", lambda api, **kw: hub.upload_folder(api, **kw))
    try:
        assert main(["--config", str(recipe)]) == 0
    finally:
        patch.undo()
    return SimpleNamespace(hub=hub, out=root / "out", recipe=recipe, policy=policy, final=hub.uploads[-1])


def test_final_push_sends_exactly_the_model_tokenizer_card_and_code(pushed):
    assert set(pushed.hub.repos) == {HUB_ID}  # made before any model loaded, found again by the Trainer
    final = pushed.final
    assert final.repo_id == HUB_ID and final.folder == str(pushed.out) and final.path_in_repo == ""
    assert set(final.files) == FINAL_FILES
    config = json.loads((final.snapshot / "config.json").read_text())
    assert config["auto_map"]["AutoConfig"] == "configuration_minimind.MiniMindConfig"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_minimind.MiniMindForCausalLM"


def test_checkpoints_are_pushed_from_their_final_folder_only(pushed):
    model_pushes = [upload for upload in pushed.hub.uploads[:-1] if upload.path_in_repo == ""]
    assert model_pushes and all(upload.ignore_patterns == OUTPUT_FOLDER_IGNORE for upload in model_pushes)  # as ours
    checkpoint_pushes = [upload for upload in pushed.hub.uploads if upload.path_in_repo == "last-checkpoint"]
    assert [Path(upload.folder).name for upload in checkpoint_pushes] == ["checkpoint-1", "checkpoint-2"]
    for upload in checkpoint_pushes:
        assert "_staging" not in upload.folder
        assert "trainer_state.json" in upload.files and "model.safetensors" in upload.files


def test_model_card_states_base_recipe_rewards_metrics_and_seed_parity(pushed):
    text = (pushed.final.snapshot / "README.md").read_text()
    card = ModelCard(text)  # the YAML header parses
    assert "trl" in card.data.tags and "grpo" in card.data.tags
    assert f"- **Base model:** `{pushed.policy}`" in text
    assert f"- **Recipe:** `{pushed.recipe}`" in text
    for row in ("| format | 1 |", "| tag_count | 0.5 |", "| grpo_fixtures:token_reward | 2 |"):
        assert row in text
    state = json.loads((pushed.out / "checkpoint-2" / "trainer_state.json").read_text())
    last = [entry for entry in state["log_history"] if "reward" in entry][-1]
    assert last["step"] == 2
    assert f"| reward | {last['reward']:g} |" in text
    assert f"| rewards/token_reward/mean | {last['rewards/token_reward/mean']:g} |" in text
    assert "| beta | 0.02 | 0.02 | --beta | yes |" in text
    assert "| learning_rate | 0.01 | 8e-08 | --learning_rate | no |" in text
    assert "| num_generations | 4 | 8 | --num_generations | no |" in text
    assert f'AutoModelForCausalLM.from_pretrained("{HUB_ID}", trust_remote_code=True)' in text
    assert "<details><summary>Recipe</summary>" in text and "grpo_fixtures:token_reward" in text


def test_pushed_folder_loads_and_generates_without_minimind_trl(pushed):
    script = (
        "import sys\n"
        "sys.modules['minimind_trl'] = None  # the package is not installed for this user\n"
        "import torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "folder = sys.argv[1]\n"
        "model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)\n"
        "assert type(model).__module__.startswith('transformers_modules'), type(model).__module__\n"
        "tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)\n"
        "messages = [{'role': 'user', 'content': 'hi'}]\n"
        "ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors='pt', return_dict=True)\n"
        "out = model.generate(**ids, max_new_tokens=4, do_sample=False)\n"
        "print(out.shape[1] - ids['input_ids'].shape[1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(pushed.final.snapshot)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=subprocess_env(HF_MODULES_CACHE=str(pushed.final.snapshot.parent / "hf_modules")),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Do you wish to run the custom code" not in result.stdout
    assert int(result.stdout.strip().splitlines()[-1]) > 0


def test_native_pth_is_pushed_for_minimind_scripts(pushed):
    import torch

    state = torch.load(pushed.final.snapshot / "grpo_32.pth", weights_only=True)
    assert "lm_head.weight" in state and "model.embed_tokens.weight" in state
    assert json.loads((pushed.final.snapshot / "grpo_32.config.json").read_text())["hidden_size"] == 32


def test_push_check_refuses_folders_people_could_not_load(tmp_path):
    policy = build_tiny_policy(tmp_path / "model")
    assert "modeling_minimind.py" in check_push_folder(str(policy))
    config = json.loads((policy / "config.json").read_text())
    del config["auto_map"]["AutoModelForCausalLM"]
    (policy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PushCheckError, match="auto_map lacks"):
        check_push_folder(str(policy))
    config["auto_map"]["AutoModelForCausalLM"] = "modeling_minimind.MiniMindForCausalLM"
    (policy / "config.json").write_text(json.dumps(config))
    assert {"feed_forward_minimind.py", "shared_prefix_minimind.py"} <= set(check_push_folder(str(policy)))
    os.remove(policy / "shared_prefix_minimind.py")  # imported by modeling_minimind.py: needed to load it
    with pytest.raises(PushCheckError, match="shared_prefix_minimind.py"):
        check_push_folder(str(policy))
    os.remove(policy / "modeling_minimind.py")
    with pytest.raises(PushCheckError, match="modeling_minimind.py"):
        check_push_folder(str(policy))


def test_final_metrics_take_the_last_logged_step():
    history = [{"reward": 0.1, "step": 1, "rewards/a/mean": 0.1}, {"reward": 0.3, "step": 2, "rewards/a/mean": 0.3}]
    history.append({"train_runtime": 5.0, "train_loss": 0.2, "step": 2})
    assert final_metrics(history) == {
        "step": 2,
        "reward": 0.3,
        "rewards/a/mean": 0.3,
        "train_runtime": 5.0,
        "train_loss": 0.2,
    }


# --------------------------------------------------------------------------- a Hub that cannot be reached or refuses

UNREACHABLE = {  # how the Hub fails: (stand-in or not, in-process settings, what the one line says)
    "offline mode": (None, "offline mode is on (HF_HUB_OFFLINE=1). Unset HF_HUB_OFFLINE to reach it"),
    "no connection": ("closed port", "ConnectError: [Errno 111] Connection refused. Check the network and HF_ENDPOINT"),
    "creation refused": (401, "HTTP 401: stand-in Hub: you may not create it. Log in with a token that may write"),
}


@pytest.mark.parametrize("failure", list(UNREACHABLE))
def test_an_unreachable_hub_stops_the_run_before_any_model_loads(failure, tmp_path, monkeypatch, capsys):
    from transformers import PreTrainedModel

    kind, expected = UNREACHABLE[failure]
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl"), push_to_hub=True, hub_model_id=HUB_ID)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(lambda *a, **k: pytest.fail("a model loaded")))
    with HubStandIn(create_status=kind if isinstance(kind, int) else 200) as hub:
        endpoint = {None: None, "closed port": f"http://127.0.0.1:{free_port()}"}.get(kind, hub.endpoint)
        in_process_hub(monkeypatch, endpoint, offline=kind is None)
        code = main(["--config", str(recipe)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    shown = endpoint or "https://huggingface.co"
    assert line.startswith(f"minimind-trl grpo: error: push_to_hub: the Hugging Face Hub ({shown}) could not create or "
                           f"find the repository {HUB_ID}: {expected}")  # fmt: skip
    assert line.endswith("or train without --push_to_hub and push the output folder afterwards (minimind-trl push)")
    assert not (tmp_path / "out").exists()


def test_a_bad_hub_model_id_is_refused_before_the_hub_is_asked(tmp_path, capsys):
    recipe = tiny_recipe(tmp_path, tmp_path / "policy", tmp_path / "data.jsonl", push_to_hub=True)
    build_tiny_policy(tmp_path / "policy")
    write_rlaif(tmp_path / "data.jsonl")
    assert main(["--config", str(recipe), "--hub_model_id", "someone/two/slashes"]) == 2
    assert "error: hub_model_id 'someone/two/slashes' is not a Hub repository id" in capsys.readouterr().err


def test_a_hub_that_refuses_uploads_leaves_every_local_output_and_exits_3(tmp_path):
    """A real user's run against a Hub that makes the repository and refuses every upload: the checkpoints' background
    pushes and the final push each fail once, visibly, and nothing local is lost."""
    policy = build_tiny_policy(tmp_path / "policy")
    recipe = tiny_recipe(
        tmp_path, policy, write_rlaif(tmp_path / "rlaif.jsonl", PROMPTS[:4]), save_strategy="steps", save_steps=1,
        save_native_pth=True, push_to_hub=True, hub_model_id=HUB_ID, hub_strategy="checkpoint", hub_always_push=True,
    )  # fmt: skip
    with HubStandIn(status=403) as hub:
        result = subprocess.run(
            [sys.executable, "-m", "minimind_trl.grpo", "--config", str(recipe)],
            env=subprocess_env(HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="0", HF_TOKEN="hf_stand_in"),
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
        )  # fmt: skip
    assert result.returncode == PUSH_FAILED_EXIT_CODE, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    out = tmp_path / "out"
    assert FinalOutputs.found_in(str(out)).missing(save_native_pth=True) == []
    for checkpoint in ("checkpoint-1", "checkpoint-2"):
        assert {"model.safetensors", "trainer_state.json", "grpo_32.pth"} <= set(os.listdir(out / checkpoint))
    assert not (out / "_staging").exists() and not (out / "_minimind_run.lock").exists()

    failed = [line for line in result.stderr.splitlines() if " failed: HTTP 403: stand-in Hub: uploads are refused" in line]
    pushes = [line.split("the push of ")[1].split(f" to {HUB_ID}")[0] for line in failed]
    assert sorted(pushes) == sorted([  # each push reported once
        "the model of checkpoint-1", "checkpoint-1 itself", "the model of checkpoint-2", "checkpoint-2 itself",
        f"the final model in {out}",
    ])  # fmt: skip
    assert len(hub.uploads()) >= len(pushes) and hub.created() >= 1
    summary = result.stderr.strip().splitlines()[-1]
    assert summary == (
        f"minimind-trl grpo: training finished and its outputs are complete in {out}, but 5 push(es) to {HUB_ID} on "
        f"the Hub ({hub.endpoint}) failed (each one is reported above). Push the folder once the Hub is reachable: "
        f"minimind-trl push {out} --hub_model_id {HUB_ID}"
    )


def test_a_finished_folder_people_could_not_load_is_a_failed_push_not_an_upload(tmp_path, monkeypatch):
    from minimind_trl.cli import grpo
    from minimind_trl.hub_uploads import HubPushes

    out = build_tiny_policy(tmp_path / "out")
    os.remove(out / "tokenizer.json")
    monkeypatch.setattr(grpo, "upload_output_folder", lambda *a, **k: pytest.fail("an incomplete folder was uploaded"))
    trainer = SimpleNamespace(
        args=SimpleNamespace(output_dir=str(out), hub_token=None, hub_revision=None, push_to_hub=True),
        hub_model_id=HUB_ID, hub_pushes=HubPushes(HUB_ID), is_world_process_zero=lambda: True,
    )  # fmt: skip
    grpo.push_final(trainer)
    (failure,) = trainer.hub_pushes.failures
    assert f"the push of the final model in {out} to {HUB_ID}" in failure
    assert failure.endswith("PushCheckError: " + f"{out} lacks ['tokenizer.json']; refusing to push an incomplete model")
    assert grpo.push_summary(trainer).startswith(f"training finished and its outputs are complete in {out}, but 1 push")
