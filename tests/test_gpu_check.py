"""The GPU check (`benchmarks/gpu_check.sh`) in its CPU form, so it cannot rot between the rare GPU loans: the script
runs the parts asked for, writes the JSON report and the log under $OUT, runs the `gpu` tests' bodies on CPU, measures
the side-by-side benchmark at tiny sizes, its compiled variants included. No timing is asserted."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check_out")
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    env.pop("MINIMIND_TEST_DEVICE", None)  # the --cpu form sets it for its parts
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu", "env", "precision", "bench", "bench_compile"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    return result, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.log").read_text()


def test_the_cpu_form_runs_the_parts_asked_and_reports_them(cpu_check):
    result, report, log = cpu_check
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert report["form"] == "cpu" and list(report["parts"]) == ["env", "precision", "bench", "bench_compile"]
    assert report["failed"] == [] and report["seconds"] > 0
    pins = dict(line.split("==") for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines() if "==" in line)
    env = report["parts"]["env"]
    assert env["status"] == "passed" and env["versions"]["transformers"] == pins["transformers"]
    assert env["versions"]["cuda_available"] in (True, False) and env["versions"]["minimind_trl_path"].startswith(str(REPO))
    precision = report["parts"]["precision"]  # the CUDA tests' bodies, run on CPU
    assert precision["status"] == "passed" and precision["counts"]["passed"] == len(precision["tests"]) == 4 + 3
    assert sum("test_scores_on_the_device_match_cpu" in t["test"] for t in precision["tests"]) == 3  # the reward model
    assert "pytest" in log and "test_gpu_precision.py" in log and "gpu_step.py" in log


def test_the_benchmark_reports_both_sides(cpu_check):
    _, report, _ = cpu_check
    bench = report["parts"]["bench"]
    assert bench["status"] == "passed"
    summary = bench["benchmark"]
    assert summary["device"] == "cpu" and summary["peak_tflops"] > 0 and summary["model_gflop_per_step"] > 0
    assert set(summary["sides"]) == {"seed", "ours:default", "ours:share_prompts"}
    for name, side in summary["sides"].items():
        assert side["status"] == "ok", (name, side)
        assert side["s_per_step"] > 0 and side["gen_tokens_per_s"] > 0 and 0 < side["mfu"] < 1
        assert set(side["phases"]) == {"generation", "logprobs", "reward", "backward_step"}
        assert all(seconds > 0 for seconds in side["phases"].values()), (name, side["phases"])
        assert sum(side["phases"].values()) <= side["s_per_step"] * 1.001, (name, side)
        assert side["completion_tokens_per_step"] == 2 * 2 * 4 and side["peak_memory_mb"] is None  # no GPU memory
        assert (name == "seed") == ("speedup_vs_seed" not in side)
    assert summary["sides"]["ours:share_prompts"]["levers"]["shared_prompts"] is True
    for name, side in summary["sides"].items():  # --profile: one more step each, its profile (no device on CPU)
        profile = side["profile"]
        assert profile["wall_s"] > 0 and profile["device_events"] == 0 and profile["top_self_cpu"], (name, profile)
    # the lean sampler decodes in its weights' dtype: bf16 only where bf16 training meets a bf16-native CPU
    default = summary["sides"]["ours:default"]
    assert default["levers"]["decode_precision"] in (("bfloat16", "float32") if default["precision"] == "bf16"
                                                     else ("float32",))  # fmt: skip


def test_the_compiled_variants_run_on_cpu_through_the_static_cache_and_a_compiled_forward(cpu_check):
    """transformers compiles `generate`'s forward on accelerators only; the CPU form lifts that with CompileConfig's
    testing switch, so the variants the GPU times run the same path (the trainer, stock `generate`, a static cache, the
    compiled forward) in CI and cannot rot between loans."""
    _, report, _ = cpu_check
    compiled = report["parts"]["bench_compile"]
    assert compiled["status"] == "passed", compiled
    sides = compiled["benchmark"]["sides"]
    assert set(sides) == {"ours:static_compile", "ours:reduce_overhead"}  # --no-seed: upstream's loop not rerun
    for name, side in sides.items():
        assert side["status"] == "ok", (name, side)
        assert side["levers"]["cache_implementation"] == "static" and side["levers"]["compiled_forward"] is True
        assert side["completion_tokens_per_step"] == 2 * 2 * 4 and side["gen_tokens_per_s"] > 0
        assert side["levers"]["compiled_graphs"] == 1  # compiled once, for every step: never recompiled
    # the counter of graphs run without CUDA graphs is live: inductor skips them for a CPU graph (on CUDA such a skip
    # fails the reduce_overhead side, whose speed would not be CUDA graphs')
    assert sides["ours:static_compile"]["levers"]["cudagraph_skips"] == 0
    assert sides["ours:reduce_overhead"]["levers"]["cudagraph_skips"] >= 1
    # inductor logs a reason for CUDA graphs only (a CPU graph's skip is counted in silence): caught as a list
    assert [side["levers"]["cudagraph_skip_reasons"] for side in sides.values()] == [[], []]
    for side in sides.values():  # stock `generate` calls the forward accelerate wraps in autocast
        assert side["levers"]["decode_precision"] == ("bf16 autocast" if side["precision"] == "bf16" else "float32")
        assert side["profile"]["top_self_cpu"] and side["profile"]["graph_launches"] == 0


def test_a_skip_of_cuda_graphs_says_why():
    """On CUDA a `reduce_overhead` side that ran without CUDA graphs fails, and its error gives inductor's reasons,
    caught from the logger that inductor's skip function writes to (the CPU form's skips carry no reason)."""
    import gpu_step
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    with gpu_step.LoggedWarnings(gpu_step.cudagraphs_logger()) as reasons:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (1 instances)")
    log_cudagraph_skip_and_bump_counter("after the block: not caught")
    assert reasons == ["skipping cudagraphs due to mutated inputs (1 instances)"]


def test_a_failing_part_and_a_part_over_budget_are_reported(tmp_path, monkeypatch):
    import gpu_check

    (tmp_path / "test_always_fails.py").write_text(
        "import pytest\npytestmark = pytest.mark.gpu\n\ndef test_fails():\n    assert 1 == 2\n"
    )
    monkeypatch.setitem(gpu_check.PARTS, "precision", ([str(tmp_path / "test_always_fails.py")], 120, 120))
    out = tmp_path / "out"
    assert gpu_check.main(["--cpu", "--out", str(out), "precision"]) == 1
    report = json.loads((out / "gpu_check.json").read_text())
    part = report["parts"]["precision"]
    assert part["status"] == "failed" and part["counts"]["failed"] == 1 and report["failed"] == ["precision"]
    assert any("test_fails" in line for line in part["error"])
    # a budget spent by the first part: the next is skipped, and said so
    assert gpu_check.main(["--cpu", "--out", str(out), "--budget-s", "0.001", "precision", "zero"]) == 1
    part = json.loads((out / "gpu_check.json").read_text())["parts"]["zero"]
    assert part["status"] == "skipped" and part["reason"].startswith("budget")


HANGS = """import os, subprocess, sys, time
import pytest
pytestmark = pytest.mark.gpu

def test_hangs():
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    # one child in the part's process group, one in a session of its own (as tests/gpu's run_launch starts a launch)
    child, launcher = subprocess.Popen(sleep), subprocess.Popen(sleep, start_new_session=True)
    with open(os.environ["PID_FILE"], "w") as file:
        file.write(f"{child.pid} {launcher.pid} {os.environ['GPU_CHECK_DEADLINE']}")
    time.sleep(600)
"""


def gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for a parent that reaps it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_a_part_past_its_limit_is_stopped_with_every_process_it_started(tmp_path, monkeypatch):
    """A hung part (a ZeRO launch whose workers wait on a collective) must not hold the GPU for the parts after it:
    the part's whole process group goes at its limit, and the part knew its end (GPU_CHECK_DEADLINE) to time out its
    own subprocesses first."""
    import gpu_check

    (tmp_path / "test_hangs.py").write_text(HANGS)
    # a 25 s limit on CPU: room for pytest to start on a busy machine before the test writes its child's pid
    monkeypatch.setitem(gpu_check.PARTS, "lora", ([str(tmp_path / "test_hangs.py")], 120, 25))
    monkeypatch.setenv("PID_FILE", str(tmp_path / "pid"))
    began = time.time()
    assert gpu_check.main(["--cpu", "--out", str(tmp_path / "out"), "lora"]) == 1
    part = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["parts"]["lora"]
    assert part["status"] == "timeout" and part["exit"] is None
    pid, launcher_pid, deadline = (tmp_path / "pid").read_text().split()
    assert began + 24 < float(deadline) < time.time()
    assert gone(int(pid)), f"the part's own child {pid} outlived the part"
    assert gone(int(launcher_pid)), f"the part's child in a session of its own, {launcher_pid}, outlived the part"


PASSES = """import pytest
pytestmark = pytest.mark.gpu

def test_passes():
    pass
"""
# the check run as `gpu_check.sh` runs its driver, with two parts of its own: one that passes, one that hangs
DRIVER = """import sys
sys.path.insert(0, sys.argv[1])
import gpu_check
gpu_check.PARTS.update(precision=([sys.argv[2]], 120, 120), lora=([sys.argv[3]], 120, 120))
sys.exit(gpu_check.main(["--cpu", "--out", sys.argv[4], "precision", "lora", "resume"]))
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_check_stops_its_part_and_says_so_in_its_report(tmp_path, sig):
    """Ctrl-C (SIGINT) or `timeout`'s SIGTERM stops the running part with every process it started (its own session
    and strays, as at its limit), writes a report marked interrupted that lists the parts finished, and exits with
    128 + the signal's number; the log says which part was stopped."""
    (tmp_path / "test_passes.py").write_text(PASSES)
    (tmp_path / "test_hangs.py").write_text(HANGS)
    out, pid_file = tmp_path / "out", tmp_path / "pid"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(REPO / "benchmarks"), str(tmp_path / "test_passes.py"),
         str(tmp_path / "test_hangs.py"), str(out)],
        cwd=REPO, env=dict(os.environ, PID_FILE=str(pid_file)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        until = time.monotonic() + 240
        while not pid_file.exists() or len(pid_file.read_text().split()) < 3:  # the hanging part's children started
            assert driver.poll() is None and time.monotonic() < until, driver.communicate()
            time.sleep(0.2)
        driver.send_signal(sig)
        stdout, stderr = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode == 128 + sig, stdout + stderr
    assert "Traceback" not in stderr
    assert f"gpu_check: interrupted by {sig.name}; stopped lora; finished: precision" in stderr
    pid, launcher_pid, _ = pid_file.read_text().split()
    assert gone(int(pid)) and gone(int(launcher_pid)), "a process of the interrupted part outlived the check"
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["interrupted"] == {"signal": sig.name, "stopped": ["lora"], "not_run": ["resume"]}
    assert [(part, result["status"]) for part, result in report["parts"].items()] == [
        ("precision", "passed"), ("lora", "interrupted")]
    assert f"stopped: the check was interrupted ({sig.name})" in (out / "gpu_check.log").read_text()


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--budget-s", "-1"], "--budget-s must be a positive number of seconds (inf: no limit), not -1.0"),
        (["--budget-s", "0"], "--budget-s must be a positive number of seconds"),
        (["--budget-s", "nan"], "--budget-s must be a positive number of seconds (inf: no limit), not nan"),
        (["--budget-s", "soon"], "argument --budget-s: invalid float value: 'soon'"),
        (["--jobs", "0"], "--jobs must be at least 1"),
    ],
)
def test_a_budget_that_is_no_positive_number_is_refused(argv, problem, capsys):
    """`--budget-s -1` skipped every part and passed: a check that checked nothing."""
    import gpu_check

    with pytest.raises(SystemExit) as ended:
        gpu_check.parse_args(argv)
    assert ended.value.code == 2 and problem in capsys.readouterr().err
    assert gpu_check.parse_args(["--budget-s", "inf"]).budget_s == float("inf")


def unwritable_outs(tmp_path: Path) -> dict:
    """OUT folders no check can write its report into, as the paths they are given by."""
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "report_is_a_folder" / "gpu_check.json").mkdir(parents=True)
    (tmp_path / "log_is_a_folder" / "gpu_check.log").mkdir(parents=True)
    (tmp_path / "lock_is_a_link").mkdir()
    (tmp_path / "lock_is_a_link" / "gpu_check.lock").symlink_to(tmp_path / "a_file")
    return {
        "a_file": "not a folder",
        "a_file/below": "cannot write there",
        "report_is_a_folder": "cannot write",
        "log_is_a_folder": "cannot write",
        "lock_is_a_link": "cannot write there",
    }


def test_an_out_that_cannot_be_written_is_one_line_before_any_part(tmp_path, capsys):
    import gpu_check

    for name, problem in unwritable_outs(tmp_path).items():
        assert gpu_check.main(["--cpu", "--out", str(tmp_path / name), "env"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"gpu_check: error: OUT={tmp_path / name}") and problem in err, (name, err)
        assert len(err.strip().splitlines()) == 1
    assert (tmp_path / "a_file").read_text() == "x"  # the link was not followed
    assert not (tmp_path / "report_is_a_folder" / "gpu_check.log").exists()  # no part ran


def test_the_script_refuses_an_unwritable_out_before_installing_anything(tmp_path):
    (tmp_path / "a_file").write_text("x")
    env = dict(os.environ, OUT=str(tmp_path / "a_file"), PYTHON=sys.executable)
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu", "env"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"gpu_check: error: OUT={tmp_path / 'a_file'}: cannot write there")


def test_a_second_check_into_the_same_out_is_refused_while_the_first_runs(tmp_path, capsys):
    """Two checks into one OUT would overwrite each other's report and log (and the script's wheel install): the one
    that comes second is refused, by the script before it installs anything and by the driver; the lock goes with the
    check that held it, however that ended."""
    import gpu_check

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import gpu_check; "
         "gpu_check.hold_out(pathlib.Path(sys.argv[2])); print('held', flush=True); sys.stdin.read()",
         str(REPO / "benchmarks"), str(out)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        assert gpu_check.main(["--cpu", "--out", str(out), "env"]) == 2
        assert f"OUT={out} is in use by another GPU check (pid {holder.pid})" in capsys.readouterr().err
        env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
        result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--cpu", "env"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert result.returncode == 2 and f"is in use by another GPU check (pid {holder.pid})" in result.stderr
        assert result.stdout == ""  # refused before anything was installed or imported
        assert not (out / "gpu_check.json").exists()
    finally:
        holder.kill()  # killed, not ended: the lock goes with it
        holder.wait()
    fd = gpu_check.hold_out(out)
    os.close(fd)


SKIPS = """import pytest
pytestmark = pytest.mark.gpu

def test_skips():
    pytest.skip("needs something this machine lacks")
"""


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-form", "cpu-form"])
def test_a_gpu_test_skipped_on_a_gpu_fails_its_part(tmp_path, gpu):
    """On a lent GPU every `gpu` test must run: a skip there (CUDA unseen by the test, a missing package) checked
    nothing and fails the part, naming the reason. On CPU the CUDA-only tests may skip."""
    import gpu_check

    (tmp_path / "test_skips.py").write_text(SKIPS)
    part = gpu_check.TestPart([str(tmp_path / "test_skips.py")], dict(os.environ), 120, gpu=gpu)
    with open(tmp_path / "log", "w") as log:
        report = part.report(log)
    assert report["counts"]["skipped"] == 1 and "lacks" in report["reason"]
    assert report["status"] == ("failed" if gpu else "skipped")
    if gpu:
        assert any(line.startswith("SKIPPED") and "lacks" in line for line in report["error"]), report["error"]


def test_only_the_test_parts_divide_the_cores(monkeypatch):
    """The test parts run side by side and share the cores; a benchmark runs alone, and the CPU work of both its sides
    (the stand-in reward model) must not run on one thread, or the step it times is the CPU's."""
    import gpu_check

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(gpu_check.os, "cpu_count", lambda: 16)
    env, test_env = gpu_check.environments(gpu_check.parse_args([]))
    test_parts = [part for part in gpu_check.PARTS if gpu_check.runs_tests(part)]  # at most these run at once
    assert "OMP_NUM_THREADS" not in env and test_env["OMP_NUM_THREADS"] == str(16 // len(test_parts)) == "2"
    assert "OMP_NUM_THREADS" not in gpu_check.environments(gpu_check.parse_args(["bench", "zero"]))[1]  # one alone
    assert env["HF_HUB_OFFLINE"] == test_env["HF_HUB_OFFLINE"] == "1" and "MINIMIND_TEST_DEVICE" not in test_env
    env, test_env = gpu_check.environments(gpu_check.parse_args(["--cpu"]))
    assert env["OMP_NUM_THREADS"] == test_env["OMP_NUM_THREADS"] == "1" and test_env["MINIMIND_TEST_DEVICE"] == "cpu"


WAITS_FOR = """import os, time
import pytest
pytestmark = pytest.mark.gpu

def test_meets_the_other():
    folder = os.environ["MEET_DIR"]
    open(os.path.join(folder, "{me}"), "w").close()
    for _ in range(300):
        if os.path.exists(os.path.join(folder, "{other}")):
            return
        time.sleep(0.1)
    raise AssertionError("the other part never ran beside this one")
"""


def test_test_parts_run_side_by_side(tmp_path, monkeypatch):
    """On a GPU the test parts run at once (`--jobs`), so that one call fits them all: here two parts that can only
    pass together, each waiting for the other's mark."""
    import gpu_check

    for me, other, part in (("a", "b", "lora"), ("b", "a", "resume")):
        (tmp_path / f"test_{me}.py").write_text(WAITS_FOR.format(me=me, other=other))
        monkeypatch.setitem(gpu_check.PARTS, part, ([str(tmp_path / f"test_{me}.py")], 120, 120))
    monkeypatch.setenv("MEET_DIR", str(tmp_path))
    assert gpu_check.main(["--cpu", "--jobs", "2", "--out", str(tmp_path / "out"), "lora", "resume"]) == 0
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["jobs"] == 2 and [report["parts"][p]["status"] for p in ("lora", "resume")] == ["passed"] * 2
    assert gpu_check.side_by_side(["env", "bench", "precision", "zero", "lora", "bench_compile", "agent"], 2) == [
        ["env"], ["bench"], ["precision", "zero"], ["lora"], ["bench_compile"], ["agent"]]


def test_the_env_part_reports_requirements_the_machine_does_not_meet(tmp_path):
    """On a lent GPU the carried wheels go in with `pip install --no-deps`, past pip's resolver: the env part checks
    their requirements instead, so the first call names what to carry next. Here a distribution of `peft` first on the
    path asks for a package nobody has and for a numpy no one will release."""
    import gpu_check

    info = tmp_path / "site" / "peft-99.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: peft\nVersion: 99.0\n"
                                   "Requires-Dist: no-such-package-anywhere>=1\nRequires-Dist: numpy>=999\n"
                                   'Requires-Dist: pytest-not-needed; extra == "dev"\n')  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(REPO)]))
    with open(tmp_path / "log", "w") as log:
        part = gpu_check.env_part(gpu_check.parse_args(["--cpu", "env"]), env, 120, log)
    assert part["status"] == "failed" and "unmet requirements" in part["error"]
    unmet = [line for line in part["unmet_requirements"] if line.startswith("peft ")]
    assert "peft needs no-such-package-anywhere>=1: not installed" in unmet
    assert any(line.startswith("peft needs numpy>=999: found ") for line in unmet)
    assert len(unmet) == 2  # an extra's requirement is not the machine's


def probe_wheel(folder: Path) -> Path:
    """A minimal wheel of one module, `gpu_check_probe`, as pip installs it."""
    import zipfile

    wheel = folder / "gpu_check_probe-1.0-py3-none-any.whl"
    files = {"gpu_check_probe/__init__.py": "CARRIED = True\n",
             "gpu_check_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 1.0\n",
             "gpu_check_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                    "Tag: py3-none-any\n"}  # fmt: skip
    record = "".join(f"{name},,\n" for name in files) + "gpu_check_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, "gpu_check_probe-1.0.dist-info/RECORD": record}.items():
            archive.writestr(name, text)
    return wheel


@pytest.mark.parametrize("carried", [True, False], ids=["carried", "cpu-only"])
def test_carried_installs_the_wheels_with_the_cpu_form_as_on_a_gpu(tmp_path, carried):
    """`--cpu --carried` (the rehearsal, benchmarks/gpu_rehearsal.sh) installs the carried wheels as the GPU form does;
    `--cpu` alone uses the environment as it is."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    probe_wheel(wheels)
    site = tmp_path / "site"
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable, GPU_WHEELS_DIR=str(wheels),
               GPU_CHECK_SITE=str(site))  # fmt: skip
    env.pop("MINIMIND_TEST_DEVICE", None)
    flags = ["--cpu", "--carried"] if carried else ["--cpu"]
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", *flags, "env"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert ("installing 1 carried wheels into" in result.stdout) is carried
    assert (site / "gpu_check_probe" / "__init__.py").is_file() is carried
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert list(report["parts"]) == ["env"] and report["parts"]["env"]["status"] == "passed"  # --carried not a part
    checked = report["parts"]["env"]["versions"]["requirements_checked"]  # the carried wheels' requirements too
    assert ("gpu-check-probe" in checked) is carried and {"transformers", "trl", "deepspeed"} <= set(checked)


def test_the_gpu_form_without_the_carried_wheels_stops_before_any_part(tmp_path):
    """A call without `carry=[".gpu-wheels"]` on a machine that lacks TRL stops at once, saying what to carry, rather
    than spend the loan failing every part on its imports. Here a `trl` that cannot be imported stands in for none."""
    shadow = tmp_path / "shadow" / "trl"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no trl on this machine')\n")
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable, GPU_WHEELS_DIR=str(tmp_path / "none"),
               PYTHONPATH=str(tmp_path / "shadow"))  # fmt: skip
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "env"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 3, result.stdout[-2000:] + result.stderr[-2000:]
    assert "no trl on this machine" in result.stderr and "carry" in result.stderr
    assert not (tmp_path / "out" / "gpu_check.json").exists()  # no part ran


FIGURES = {"s_per_step": 1.5, "phases": {"generation": 1.0}, "completion_tokens_per_step": 8, "peak_memory_mb": 9.0}


@pytest.mark.parametrize("ending", ["stopped", "crashed"])
def test_a_side_stopped_or_broken_while_profiling_keeps_its_timed_figures(monkeypatch, tmp_path, ending):
    """The profiled step comes after the timed ones and the side prints its figures before it: a side stopped at its
    limit, or whose profiler breaks (CUDA's has never run here), keeps the speed ratio's figures and reports the
    profile's error; without --profile the same ending is a timeout or a failure, as before."""
    import subprocess

    import gpu_step

    partial = json.dumps(FIGURES) + "\n{}\n" + '{"s_per_st'  # a JSON line that holds no figures; killed mid-line

    def run(command, **kwargs):
        if ending == "stopped":
            raise subprocess.TimeoutExpired(command, 5, output=partial.encode())  # bytes, as run() leaves them
        return subprocess.CompletedProcess(command, 1, stdout=partial, stderr="RuntimeError: CUPTI broke\n")

    monkeypatch.setattr(gpu_step.subprocess, "run", run)
    side = gpu_step.child("seed", ["--profile"], tmp_path, timeout=5)
    assert side["status"] == "ok" and side["s_per_step"] == 1.5 and side["peak_memory_mb"] == 9.0
    assert side["profile"]["error"] == ("stopped after 5 s, while profiling" if ending == "stopped"
                                        else "RuntimeError: CUPTI broke")  # fmt: skip
    side = gpu_step.child("seed", [], tmp_path, timeout=5)
    assert side["status"] == ("timeout" if ending == "stopped" else "failed") and "s_per_step" not in side


def test_benchmark_sides_share_what_is_left_of_the_part(monkeypatch):
    """Sides run one after another; each gets at most its share of the part's remaining time, so a slow side times out
    alone and the summary of the sides measured is printed before the check stops the part."""
    import gpu_step

    monkeypatch.delenv("GPU_CHECK_DEADLINE", raising=False)
    assert gpu_step.side_timeout(155, 3) == 155
    monkeypatch.setenv("GPU_CHECK_DEADLINE", str(time.time() + 315))
    assert 95 <= gpu_step.side_timeout(155, 3) <= 100 and 145 <= gpu_step.side_timeout(155, 2) <= 150
    assert gpu_step.side_timeout(155, 1) == 155
    monkeypatch.setenv("GPU_CHECK_DEADLINE", str(time.time() - 5))
    assert gpu_step.side_timeout(155, 1) == 1.0


def collected_gpu_tests(*selection: str) -> set[str]:
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *selection]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_every_gpu_test_is_run_by_a_part_of_the_check():
    """A CUDA test the check does not select runs nowhere: pytest without CUDA skips it, and no lent GPU calls it (the
    reward model's CUDA test sat outside the check, with a device bug in its path, until this test)."""
    import gpu_check

    whole, narrowed = [], {}  # parts that select whole files; files narrowed by -k, their expressions
    for part, (what, _, _) in gpu_check.PARTS.items():
        if not gpu_check.runs_tests(part):
            continue
        if "-k" in what:
            at = what.index("-k")
            files = tuple(what[:at] + what[at + 2 :])
            narrowed.setdefault(files, []).append(what[at + 1])
        else:
            whole += what
    selected = collected_gpu_tests(*whole)
    for files, expressions in narrowed.items():
        selected |= collected_gpu_tests(*files, "-k", " or ".join(f"({e})" for e in expressions))
    everywhere = collected_gpu_tests("tests")
    assert len(everywhere) >= 18 and everywhere - selected == set()


def test_help_says_how_to_run_it_on_a_lent_gpu_in_one_call():
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--help"], cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, PYTHON=sys.executable), timeout=120)  # fmt: skip
    assert result.returncode == 0
    assert 'run(command="bash benchmarks/gpu_check.sh", carry=[".gpu-wheels"]' in result.stdout
    assert "bench_compile" in result.stdout and "--cpu" in result.stdout
