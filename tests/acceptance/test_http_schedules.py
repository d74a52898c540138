"""Schedules over the management API: a real `shardq serve` process, driven with httpx."""

from __future__ import annotations

from typing import Any

import pytest

from shardq.client.client import Client

from ..integration.test_children import registry
from ..support import wait_until
from .test_http_api import Api, StartWorker, api  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def test_a_schedule_is_created_run_paused_triggered_and_deleted(
    api: Api, start_worker: StartWorker,  # noqa: F811 - the fixture
) -> None:
    from ..app import registry as app

    start_worker(app)
    made = api.http.post("/schedules", json={"name": "nightly", "workflow": "park",
                                             "every": 1, "overlap": "allow"})
    assert made.status_code == 201, made.text
    assert made.json()["every"] == 1 and made.json()["next_at"] is not None
    wait_until(lambda: api.http.get("/schedules/nightly").json()["started"] >= 2,
               timeout=15, what="two ticks")
    assert api.http.post("/schedules/nightly/pause").json()["paused"] is True
    assert api.http.post("/schedules/nightly/trigger").json()["triggered_at"] is not None
    assert api.http.post("/schedules/nightly/resume").json()["paused"] is False
    listed = api.http.get("/schedules").json()
    assert [s["name"] for s in listed["items"]] == ["nightly"]
    # Another tenant sees none of it.
    assert api.other.get("/schedules").json()["items"] == []
    assert api.other.get("/schedules/nightly").status_code == 404
    assert api.http.delete("/schedules/nightly").status_code == 200
    assert api.http.get("/schedules/nightly").status_code == 404
    assert api.http.post("/schedules", json={"name": "nightly", "workflow": "park",
                                             "every": 60}).status_code == 201
    taken = api.http.post("/schedules", json={"name": "nightly", "workflow": "park",
                                              "every": 60})
    assert taken.status_code == 409 and "exists already" in taken.json()["error"]


BAD_SCHEDULES: list[tuple[dict[str, Any], int, str]] = [
    ({"name": "s", "workflow": "park", "cron": "0 0 30 2 *"}, 400, "Bad day-of-month"),
    ({"name": "s", "workflow": "park", "every": "5"}, 400, "`every` must be a number"),
    ({"name": "s", "workflow": "park", "every": True}, 400, "`every` must be a number"),
    ({"name": "s", "workflow": "park"}, 400, "exactly one of cron and every"),
    ({"name": "s", "workflow": "nope", "every": 5}, 404, "unknown workflow"),
    ({"name": "s x", "workflow": "park", "every": 5}, 400, "schedule name"),
    ({"name": "s", "workflow": "park", "every": 5, "timezone": "Nowhere/X"}, 400,
     "not a known IANA"),
    ({"name": "s", "workflow": "park", "every": 5, "overlap": 3}, 400, "`overlap` must be"),
    ({"name": "s", "workflow": "park", "every": 5, "cadence": 1}, 400, "unknown key"),
    ({"name": "s", "workflow": "park", "every": 5, "catchup_window": -5}, 400,
     "catchup_window"),
    ({"name": "s\u0000", "workflow": "park", "every": 5}, 400, "schedule name"),
]
"""Hostile schedules: the body, the status and what the error says. One server for all
of them (a server per row cost a second and a half each)."""


def test_a_bad_schedule_is_a_4xx_and_stores_nothing(api: Api) -> None:  # noqa: F811
    for body, status, error in BAD_SCHEDULES:
        refused = api.http.post("/schedules", json=body)
        assert refused.status_code == status, (body, refused.text)
        assert error in refused.json()["error"], (body, refused.text)
    assert api.http.get("/schedules").json()["items"] == []
    assert api.http.post("/schedules/missing/pause").status_code == 404


def test_a_run_view_names_its_children_and_a_child_its_parent(
    api: Api, client: Client, start_worker: StartWorker,  # noqa: F811 - the fixture
) -> None:
    start_worker(registry)
    run = client.start("parent", "view-parent", {"workflow": "add", "id": "view-child",
                                                 "input": {"a": 1, "b": 2}}, tenant="acme")
    assert client.wait(run.execution_id, timeout=20, tenant="acme").output == {"output": 3}
    shown = api.http.get(f"/workflows/{run.execution_id}").json()
    (child,) = shown["children"]
    assert (child["workflow"], child["workflow_id"], child["ended"]) == (
        "add", "view-child", "completed")
    assert shown["parent"] is None
    of = api.http.get(f"/workflows/{child['execution_id']}").json()["parent"]
    assert of == {"execution_id": str(run.execution_id), "position": 0}
    other = api.other.get(f"/workflows/{child['execution_id']}")
    assert other.status_code == 404
