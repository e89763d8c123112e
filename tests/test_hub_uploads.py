"""A Hub failure in one line whatever the kind (offline, HTTP status with the server's message, the HTTP library's
transport errors), and each failed background upload recorded once, whether its callback or the final `settle`
sees it first."""

import logging
import sys
from concurrent.futures import Future

import pytest
from huggingface_hub.errors import HfHubHTTPError, HTTPError, OfflineModeIsEnabled

from minimind_trl.hub_uploads import HUB_FAILURES, HubPushes, failure_line, hub_endpoint, remedy

HTTP = sys.modules[HTTPError.__module__]  # huggingface_hub's HTTP library (httpx2; httpx before huggingface_hub 2)
TRANSPORT = HTTP.ConnectError  # a DNS failure or refused connection


def http_error(status: int, server_message: str | None) -> HfHubHTTPError:
    response = HTTP.Response(status, request=HTTP.Request("POST", "https://hub.example/api/x"))
    return HfHubHTTPError("403 Forbidden: long text\nmore lines", response=response, server_message=server_message)


@pytest.mark.parametrize("exc, line, advice", [
    (OfflineModeIsEnabled("Cannot reach https://hub.example: offline mode is enabled."),
     "offline mode is on (HF_HUB_OFFLINE=1)", "Unset HF_HUB_OFFLINE"),
    (http_error(403, "You have exceeded your storage quota"), "HTTP 403: You have exceeded your storage quota",
     "Log in with a token that may write there"),
    (http_error(500, None), "HTTP 500: 403 Forbidden: long text", "Check the network and HF_ENDPOINT"),
    (TRANSPORT("[Errno -2] Name or service not known"), "ConnectError: [Errno -2] Name or service not known",
     "Check the network and HF_ENDPOINT"),
])  # fmt: skip
def test_every_kind_of_hub_failure_is_one_line_with_its_advice(exc, line, advice):
    assert isinstance(exc, HUB_FAILURES)
    assert failure_line(exc) == line and "\n" not in failure_line(exc)
    assert remedy(exc).startswith(advice)


def failed_future(exc) -> Future:
    future = Future()
    future.set_exception(exc)
    return future


def test_each_failed_upload_is_recorded_once_however_it_is_seen(caplog):
    pushes = HubPushes("someone/model")
    done, cancelled, pending_failure = Future(), Future(), Future()
    done.set_result(None)
    cancelled.cancel()
    with caplog.at_level(logging.WARNING, logger="minimind_trl.hub_uploads"):
        pushes.watch(failed_future(TRANSPORT("connection reset")), "checkpoint-1")  # done before it is watched
        pushes.watch(done, "checkpoint-2")
        pushes.watch(cancelled, "checkpoint-3")
        pushes.watch(pending_failure, "checkpoint-4")
        pending_failure.set_exception(http_error(413, "payload too large"))  # its callback reports it now
        pushes.failed("the final model", OfflineModeIsEnabled("offline"), then="its files stay there")
        failures = pushes.settle()  # sees every watched upload again: reports none twice
    assert [line.split(" failed: ")[0] for line in failures] == [
        f"the push of {what} to someone/model ({hub_endpoint()})"
        for what in ("checkpoint-1", "checkpoint-3", "checkpoint-4", "the final model")
    ]
    assert failures[1].endswith("CancelledError: the upload was cancelled before it ran")
    assert failures[2].endswith("HTTP 413: payload too large")
    assert len(caplog.records) == 4 and caplog.records[-1].getMessage().endswith("; its files stay there")
