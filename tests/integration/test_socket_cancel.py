"""Cancel over a socket needs the cancel permission, not the steering one."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from chamvi_runs import start_run
from chamvi_runs.models import Run
from tests.integration.test_websocket import (
    command,
    headers_for,
    run_path,
)
from tests.support.helpers import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def test_cancel_over_the_socket_needs_the_cancel_permission_not_the_steer_one():
    owner = make_user("owner")
    canceller = make_user("canceller", "chamvi_runs.view_run", "chamvi_runs.cancel_run")
    steerer = make_user("steerer", "chamvi_runs.view_run", "chamvi_runs.change_run")
    run = start_run("basic", "go", created_by=owner)
    refused = async_to_sync(command)(run_path(run), headers_for(steerer), {"type": "cancel"})
    assert refused["type"] == "error" and refused["code"] == "forbidden"
    assert Run.objects.get(pk=run.pk).status == "queued"
    # The steerer may still steer: input needs change_run, not cancel_run.
    steered = async_to_sync(command)(run_path(run), headers_for(steerer), {"type": "input", "payload": 1})
    assert steered["type"] == "ack"
    refused = async_to_sync(command)(run_path(run), headers_for(canceller), {"type": "input", "payload": 2})
    assert refused["type"] == "error" and refused["code"] == "forbidden"
    cancelled = async_to_sync(command)(run_path(run), headers_for(canceller), {"type": "cancel"})
    assert cancelled == {"type": "ack", "action": "cancel", "status": "cancelled"}
    assert Run.objects.get(pk=run.pk).status == "cancelled"
