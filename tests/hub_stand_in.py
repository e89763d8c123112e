"""A local stand-in for the Hugging Face Hub's HTTP API (`HF_ENDPOINT=stand_in.endpoint`), as a user's failing Hub
would answer: it creates repositories (or refuses them with `create_status`) and refuses every other request (an
upload's first calls) with `status`, recording each request it got. `in_process_hub` points this process at it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HubStandIn:
    """`with HubStandIn(status=403) as hub:` serves on 127.0.0.1 until the block ends; `hub.requests` lists
    (method, path) of every request."""

    def __init__(self, status: int = 403, message: str = "stand-in Hub: uploads are refused", create_status: int = 200):
        self.status, self.message, self.create_status, self.requests = status, message, create_status, []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.requests.append(("POST", self.path))
                if self.path == "/api/repos/create" and stand_in.create_status != 200:
                    return self._answer(stand_in.create_status, {"error": "stand-in Hub: you may not create it"})
                if self.path == "/api/repos/create":
                    payload = json.loads(body or b"{}")
                    repo = "/".join(filter(None, [payload.get("organization"), payload.get("name")]))
                    return self._answer(200, {"url": f"{stand_in.endpoint}/{repo}"})
                return self._answer(stand_in.status, {"error": stand_in.message})

            def do_GET(self):  # noqa: N802
                stand_in.requests.append(("GET", self.path))
                self._answer(stand_in.status, {"error": stand_in.message})

            do_PUT = do_GET  # noqa: N815

            def _answer(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def created(self) -> int:
        return sum(path == "/api/repos/create" for _, path in self.requests)

    def uploads(self) -> list[str]:
        """The requests an upload starts with (`preupload`, the model card's `validate-yaml`), all refused."""
        return [path for method, path in self.requests if method == "POST" and path != "/api/repos/create"]


def in_process_hub(monkeypatch, endpoint: str | None = None, offline: bool = False) -> None:
    """Point this process's huggingface_hub at `endpoint` (read at import from HF_ENDPOINT) and offline mode."""
    from huggingface_hub import constants

    if endpoint is not None:
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
