"""Outputs are kept apart from inputs by file identity (device + inode), not by spelling: a
bind mount, another case on a case-insensitive file system or a symlinked parent name the same folder. Only what
would overwrite or delete an input is refused."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from grpo_fixtures import build_tiny_policy, subprocess_env

from minimind_trl.cli import main as cli
from minimind_trl.errors import MiniMindTRLError
from minimind_trl.path_identity import Input, check_output_apart, overlap, position_in


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("identity") / "policy")


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def spelled_apart(monkeypatch):
    """`realpath` resolving no spelling to another (as on a file system whose other spellings of a name realpath
    cannot see: other case, bind mounts): only the identity `os.stat` reports relates them."""
    monkeypatch.setattr(os.path, "realpath", lambda path, **kwargs: os.path.abspath(path))


def test_positions_follow_identity_not_spelling(tmp_path, monkeypatch):
    (tmp_path / "D" / "model").mkdir(parents=True)
    os.symlink(tmp_path / "D", tmp_path / "E")  # a second name for D, standing for a bind mount or other case
    spelled_apart(monkeypatch)
    assert position_in(tmp_path / "E" / "model", tmp_path / "D" / "model") == ()
    assert position_in(tmp_path / "E" / "model" / "new" / "x", tmp_path / "D" / "model") == ("new", "x")
    assert position_in(tmp_path / "D" / "model", tmp_path / "E") == ("model",)
    assert position_in(tmp_path / "D", tmp_path / "E" / "model") is None


def test_only_what_would_overwrite_or_delete_is_an_overlap(tmp_path):
    model = tmp_path / "X"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "notes.txt").write_text("mine")
    source = Input("model", model)
    assert overlap(model, source) == "is"
    assert overlap(tmp_path, source) == "contains"  # replacing tmp_path deletes X
    assert overlap(model / "config.json", source) == "is a file of"
    assert overlap(model / "llama", source) is None  # a new entry replaces none of the model's files
    assert overlap(model / "notes.txt", source) is None  # not read from the model folder
    assert overlap(model / "x", Input("data", model, reads=None)) == "lies inside"  # a data folder is read whole
    writes = re.compile(r"^checkpoint-\d+$")  # a filled output: only the entries it writes
    assert overlap(tmp_path, Input("policy", model), writes) is None
    assert overlap(tmp_path, Input("policy", tmp_path / "checkpoint-1"), writes) is None  # not there: nothing lost
    (tmp_path / "checkpoint-1").mkdir()
    assert overlap(tmp_path, Input("policy", tmp_path / "checkpoint-1"), writes) == "contains"


def test_a_second_name_of_a_file_of_the_input_is_that_file(tmp_path, monkeypatch):
    model = tmp_path / "X"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.link(model / "config.json", model / "CONFIG.JSON")  # the other case of a case-insensitive file system
    spelled_apart(monkeypatch)
    with pytest.raises(MiniMindTRLError, match="CONFIG.JSON is a file of the input"):
        check_output_apart(model / "CONFIG.JSON", [model])


def test_export_into_a_second_name_of_the_input_is_refused(policy, tmp_path, monkeypatch, capsys):
    """`export D/model E/model --force`, E naming D's folder; before identity, only the resolved spellings were
    compared and the input was replaced."""
    (tmp_path / "D").mkdir()
    shutil.copytree(policy, tmp_path / "D" / "model")
    os.symlink(tmp_path / "D", tmp_path / "E")
    spelled_apart(monkeypatch)
    before = snapshot(tmp_path / "D")
    argv = ["export", str(tmp_path / "D" / "model"), str(tmp_path / "E" / "model"), "--format", "llama", "--force"]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert f"output {tmp_path / 'E' / 'model'} is the input {tmp_path / 'D' / 'model'}" in err
    assert "Traceback" not in err
    assert snapshot(tmp_path / "D") == before


def _bind_mounts_work(tmp_path) -> bool:
    (tmp_path / "probe_a").mkdir()
    (tmp_path / "probe_b").mkdir()
    script = f"mount --bind {tmp_path / 'probe_a'} {tmp_path / 'probe_b'}"
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def test_export_into_a_bind_mount_of_the_input_is_refused(policy, tmp_path):
    """The real thing where the kernel lets this user bind-mount in a private mount namespace (`unshare -rm`)."""
    if not _bind_mounts_work(tmp_path):
        pytest.skip("bind mounts need a private mount namespace (unshare -rm), not available here")
    (tmp_path / "D").mkdir()
    (tmp_path / "E").mkdir()
    shutil.copytree(policy, tmp_path / "D" / "model")
    before = snapshot(tmp_path / "D")
    export = f"{sys.executable} -m minimind_trl.cli export D/model E/model --format llama --force"
    result = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount --bind D E && {export}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=subprocess_env())  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "output E/model is the input D/model" in result.stderr and "Traceback" not in result.stderr
    assert snapshot(tmp_path / "D") == before
