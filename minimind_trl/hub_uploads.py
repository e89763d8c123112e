"""Pushes to the Hugging Face Hub that cannot lose a run's work: the repository made (or refused) before training, and
every upload that fails reported once, in one line, while training and its local outputs go on.

transformers' `Trainer` creates the repository in its constructor (`init_hf_repo`) and uploads each checkpoint in the
background (`_push_from_checkpoint`, futures nobody reads: a failed one vanishes without a word); its final
`push_to_hub` raises whatever the HTTP layer raised. `create_hub_repo` turns an unreachable or refusing Hub into one
`HubError` line naming the endpoint and what to do; `HubPushes` watches the background uploads and records each
failure (`failures`), so the command can finish every local output, sum the failures up and exit with
`PUSH_FAILED_EXIT_CODE`.
"""

import logging
import threading
from concurrent import futures

from huggingface_hub.errors import HfHubHTTPError, HTTPError, OfflineModeIsEnabled

from .errors import HubError

logger = logging.getLogger(__name__)

# What a Hub call raises when the Hub is unreachable or refuses: the HTTP library's errors (huggingface_hub's own
# `HTTPError` import: httpx's in 1.x, httpx2's in 2.x; DNS failures, refused connections, timeouts), its HTTP errors
# (`HfHubHTTPError`, an OSError), offline mode (a ConnectionError), and a malformed answer (ValueError).
HUB_FAILURES = (HTTPError, OSError, ValueError)


def hub_endpoint() -> str:
    """The Hub this process talks to (`HF_ENDPOINT`, huggingface.co by default)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def failure_line(exc: BaseException) -> str:
    """A Hub call's failure in one line, without the traceback: offline mode, the HTTP status and the server's
    message, or the error's kind and first line (`ConnectError: [Errno -2] Name or service not known`)."""
    if isinstance(exc, OfflineModeIsEnabled):
        return "offline mode is on (HF_HUB_OFFLINE=1)"
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        detail = exc.server_message or str(exc).splitlines()[0]
        return f"HTTP {exc.response.status_code}: {detail.strip()}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


TRAIN_WITHOUT_PUSH = "or train without --push_to_hub and push the output folder afterwards (minimind-trl push)"


def create_hub_repo(repo_id: str, token: str | None = None, private: bool | None = None, asked_by: str = "push_to_hub",
                    otherwise: str = TRAIN_WITHOUT_PUSH) -> str:  # fmt: skip
    """Create (or find) the model repository `repo_id` as the Trainer does (`exist_ok`); an unreachable or refusing
    Hub is one `HubError` (`repo_error`). Returns the repository's id as the Hub spells it."""
    from huggingface_hub import HfApi

    try:
        return HfApi().create_repo(repo_id, token=token, private=private, exist_ok=True).repo_id
    except HUB_FAILURES as exc:
        raise repo_error(repo_id, exc, asked_by, otherwise) from exc


def repo_error(repo_id: str, exc: BaseException, asked_by: str = "push_to_hub", otherwise: str = TRAIN_WITHOUT_PUSH):
    """The one-line error of a repository the Hub could not create or find: who asked, the endpoint, why, what to
    do (`remedy`) and `otherwise`."""
    return HubError(
        f"{asked_by}: the Hugging Face Hub ({hub_endpoint()}) could not create or find the repository {repo_id}: "
        f"{failure_line(exc)}. {remedy(exc)}, {otherwise}"
    )


def remedy(exc: BaseException) -> str:
    """What to do about a Hub failure: offline mode, the token's rights, or the network and `HF_ENDPOINT`."""
    if isinstance(exc, OfflineModeIsEnabled):
        return "Unset HF_HUB_OFFLINE to reach it"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return "Log in with a token that may write there (`hf auth login`, or HF_TOKEN)"
    return "Check the network and HF_ENDPOINT"


# What the Trainer's own pushes of the output folder leave out: `_`-prefixed entries (the run's lock, `_staging`, a
# converted native policy's `_base_model`) and the `checkpoint-N` folders (`hub_strategy` pushes those on their own).
OUTPUT_FOLDER_IGNORE = ["_*", "checkpoint-*"]


def upload_output_folder(folder: str, repo_id: str, token=None, revision=None, message: str = "End of training"):
    """Upload a run's output folder as the Trainer's final push does (`upload_folder`, `OUTPUT_FOLDER_IGNORE`)."""
    from huggingface_hub import HfApi

    return HfApi().upload_folder(
        repo_id=repo_id, folder_path=folder, commit_message=message, token=token, revision=revision,
        ignore_patterns=OUTPUT_FOLDER_IGNORE,
    )  # fmt: skip


class HubPushes:
    """The uploads of one run: each failure logged once as it is known and kept in `failures` for the summary."""

    def __init__(self, repo_id: str | None):
        self.repo_id = repo_id
        self.failures: list[str] = []
        self._watched: list[tuple[futures.Future, str]] = []
        self._reported: set[int] = set()
        self._lock = threading.Lock()

    def failed(self, what: str, exc: BaseException, key: int | None = None, then: str = "training goes on") -> None:
        """Record that the upload of `what` failed with `exc`, once per `key` (a background upload's; a synchronous
        failure has none), and say so on stderr with what happens `then`."""
        with self._lock:
            if key is not None and key in self._reported:
                return
            if key is not None:
                self._reported.add(key)
            line = f"the push of {what} to {self.repo_id} ({hub_endpoint()}) failed: {failure_line(exc)}"
            self.failures.append(line)
        logger.warning("%s; %s", line, then)

    def watch(self, job: futures.Future, what: str) -> None:
        """Report `job`'s failure once, as soon as it is known (and again at `settle`, if its callback had not run)."""
        self._watched.append((job, what))
        job.add_done_callback(lambda done: self._settle_one(done, what))

    def _settle_one(self, job: futures.Future, what: str) -> None:
        if job.cancelled():
            self.failed(what, futures.CancelledError("the upload was cancelled before it ran"), id(job))
        elif job.exception() is not None:
            self.failed(what, job.exception(), id(job))

    def settle(self) -> list[str]:
        """Wait for every watched upload and report the failures not yet reported; returns all failures."""
        futures.wait([job for job, _ in self._watched if not job.cancelled()])  # a cancelled one never finishes
        for job, what in self._watched:
            self._settle_one(job, what)
        return list(self.failures)


__all__ = [
    "HUB_FAILURES",
    "OUTPUT_FOLDER_IGNORE",
    "HubPushes",
    "create_hub_repo",
    "failure_line",
    "hub_endpoint",
    "remedy",
    "repo_error",
    "upload_output_folder",
]
