"""The review inbox in a real browser: Debian's chromium driven by playwright, against a
real `shardq serve` process and a real worker."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from shardq.client.client import Client
from shardq.core.models import State
from shardq.shards.config import ShardMap
from shardq.worker.worker import Worker

from ..app import registry
from ..support import Daemon, start_api, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="Debian's chromium is not installed (.ci/run installs it: "
                              "apt-get install chromium)"),
]
ACME, GLOBEX = "sq_inbox-acme", "sq_inbox-globex"
EVIL = '<script>window.__xss = 1</script>"><img src=x onerror="window.__xss = 2">'
StartWorker = Callable[..., Worker]


@dataclass
class Site:
    base: str
    client: Client


@pytest.fixture
def site(shard_map: ShardMap, daemons: Callable[..., Daemon], tmp_path: Path,
         start_worker: StartWorker) -> Iterator[Site]:
    base, _ = start_api(daemons, shard_map, tmp_path, {ACME: "acme", GLOBEX: "globex"},
                        "--inbox-stale-after", "3600")
    start_worker(registry, poll_interval_s=1.0)
    with Client.connect(shard_map, registry) as client:
        yield Site(base, client)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


def signed_in(browser: Any, site: Site, token: str, actor: str, **options: Any) -> Any:
    """A page of a new browser context, signed in as `actor` with `token`."""
    page = browser.new_context(**options).new_page()
    page.goto(f"{site.base}/inbox")
    assert page.url.endswith("/inbox/login")
    page.fill("input[name=token]", token)
    page.fill("input[name=actor]", actor)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.base}/inbox")
    return page


def review(site: Site, key: str, **input_: Any) -> str:
    """A proposal_review run parked on its interrupt: its execution id."""
    run = site.client.start("proposal_review", key, input_, tenant="acme").execution_id
    wait_until(lambda: site.client.get(run, tenant="acme").state is State.INPUT_REQUIRED,
               what="the interrupt")
    return str(run)


def detail_url(site: Site, run: str) -> str:
    return f"{site.base}/inbox/runs/{run}/interrupts/manager_review"


def test_a_reviewer_sees_the_item_at_once_and_approving_resumes_the_run(
    browser: Any, site: Site
) -> None:
    page = signed_in(browser, site, ACME, "ann")
    run = review(site, "p-approve", amount=120, reason="team offsite")
    parked_at = time.monotonic()
    page.goto(f"{site.base}/inbox")
    row = page.locator(f"tr.item[data-execution='{run}']")
    assert row.count() == 1 and time.monotonic() - parked_at < 1.0
    # An open list keeps itself current: a run that parks later appears without a reload.
    later = review(site, "p-later", amount=3, reason="stamps")
    page.locator(f"tr.item[data-execution='{later}']").wait_for(timeout=5000)
    assert "Approve, edit or reject: 120 for team offsite" in row.inner_text()
    row.locator("a.open").click()
    assert "team offsite" in page.locator("pre.input").inner_text()
    assert "prepare" in page.locator("dl.steps").inner_text()
    page.click("button.action-approve")
    assert "Decided: approve by ann" in page.locator(".outcome").inner_text()
    done = site.client.wait(run, tenant="acme", timeout=10)
    assert (done.state, done.output["by"]) == (State.COMPLETED, "ann")
    page.goto(f"{site.base}/inbox")
    assert page.locator(f"tr.item[data-execution='{run}']").count() == 0
    page.goto(f"{site.base}/inbox/runs/{run}")
    assert "run.completed" in page.locator("ol.history").inner_text()


def test_an_invalid_edit_shows_beside_its_field_and_decides_nothing(
    browser: Any, site: Site
) -> None:
    run = review(site, "p-edit", amount=5, reason="books")
    page = signed_in(browser, site, ACME, "ann")
    page.goto(detail_url(site, run))
    page.fill("input[name='field:amount']", "-3")
    page.fill("input[name='field:reason']", "books")
    page.click("button.action-edit")  # checked in the page: nothing is sent
    assert page.locator(".violation[data-for='amount']").inner_text().strip() != ""
    # Without the page's script the server checks it and answers in the same place.
    bare = signed_in(browser, site, ACME, "bob", java_script_enabled=False)
    bare.goto(detail_url(site, run))
    bare.fill("input[name='field:amount']", "-3")
    bare.fill("input[name='field:reason']", "books")
    bare.click("button.action-edit")
    beside = bare.locator(".violation[data-for='amount']").inner_text()
    assert "less than the minimum of 0" in beside
    assert bare.locator(".violation[data-for='reason']").inner_text().strip() == ""
    assert site.client.get(run, tenant="acme").state is State.INPUT_REQUIRED
    kinds = [e.kind for e in site.client.history(run, tenant="acme")]
    assert "interrupt.decided" not in kinds
    # A valid edit goes through and is what the run commits.
    bare.fill("input[name='field:amount']", "7.5")
    bare.click("button.action-edit")
    assert "Decided: edit by bob" in bare.locator(".outcome").inner_text()
    assert site.client.wait(run, tenant="acme", timeout=10).output["result"] == {
        "committed": True, "amount": 7.5, "reason": "books"}


def test_two_reviewers_at_once_one_wins_and_the_other_sees_the_winner(
    browser: Any, site: Site
) -> None:
    run = review(site, "p-race", amount=50, reason="taxi")
    ann, bob = (signed_in(browser, site, ACME, who) for who in ("ann", "bob"))
    for page in (ann, bob):
        page.goto(detail_url(site, run))
    # Both forms are submitted before either answer arrives.
    ann.evaluate("document.querySelector('form.actions').requestSubmit("
                 "document.querySelector('button.action-approve'))")
    bob.evaluate("document.querySelector('form.actions').requestSubmit("
                 "document.querySelector('button.action-reject'))")
    for page in (ann, bob):
        page.wait_for_load_state()
        page.locator(".outcome, .refusal").first.wait_for()
    refused = [p for p in (ann, bob) if p.locator(".refusal").count()]
    assert len(refused) == 1
    loser = refused[0]
    winner, action = ("bob", "reject") if loser is ann else ("ann", "approve")
    refusal = loser.locator(".refusal").inner_text()
    assert f"{winner} decided {action}" in refusal
    # A sentence for the reviewer; the code in small print, for whoever they ask.
    assert "Someone else decided first." in refusal
    assert loser.locator(".refusal small.code").inner_text() == "reason code: decided"
    decided = [e for e in site.client.history(run, tenant="acme")
               if e.kind == "interrupt.decided"]
    assert [(e.payload["actor"], e.payload["action"]) for e in decided] == [(winner, action)]
    # Every attempt is in the audit trail, the refused one too, while the run is open:
    # once the worker has finished it, a refusal stores nothing (its history ends with
    # its outcome), and the worker may well finish before the losing request lands.
    loser.goto(detail_url(site, run))
    audit = loser.locator("table.audit").inner_text()
    assert "accepted" in audit
    if any(e.kind == "interrupt.refused" for e in site.client.history(run, tenant="acme")):
        assert "refused: someone else decided first" in audit
        assert loser.locator("table.audit small.code").inner_text() == "decided"


def test_the_edit_form_starts_from_the_value_under_review(browser: Any, site: Site) -> None:
    run = review(site, "p-prefill", amount=120, reason="team offsite")
    page = signed_in(browser, site, ACME, "ann")
    page.goto(detail_url(site, run))
    shown = json.loads(page.locator("pre.value").inner_text())
    assert shown == {"amount": 120, "reason": "team offsite"}
    assert page.input_value("input[name='field:reason']") == "team offsite"
    page.fill("input[name='field:amount']", "90")  # the one field the reviewer changes
    page.click("button.action-edit")
    assert "Decided: edit by ann" in page.locator(".outcome").inner_text()
    assert site.client.wait(run, tenant="acme", timeout=10).output["result"] == {
        "committed": True, "amount": 90, "reason": "team offsite"}
    # A value a field cannot hold as it is (a text input holds one line) leaves that
    # field empty, for the reviewer to fill; the page shows the value whole.
    lines = review(site, "p-lines", amount=4, reason="first line\nsecond line")
    answer = page.goto(detail_url(site, lines))
    assert answer.status == 200
    assert "second line" in page.locator("pre.value").inner_text()
    assert page.input_value("input[name='field:amount']") == "4"
    assert page.input_value("input[name='field:reason']") == ""


def test_a_decision_made_elsewhere_replaces_the_buttons(browser: Any, site: Site) -> None:
    run = review(site, "p-elsewhere", amount=8, reason="lunch")
    page = signed_in(browser, site, ACME, "ann")
    page.goto(detail_url(site, run))
    assert page.locator("button.action-approve").count() == 1
    site.client.decide(run, "manager_review", "reject", decision_id="cli-1", actor="bob",
                       tenant="acme")
    settled = page.locator(".outcome.elsewhere")
    settled.wait_for(timeout=5000)  # the page polls every second
    assert "Decided by bob at" in settled.inner_text() and "reject" in settled.inner_text()
    assert page.locator("button.action-approve, button.action-edit").count() == 0
    state = page.request.get(detail_url(site, run) + "/state").json()
    assert (state["open"], state["action"], state["actor"]) == (False, "reject", "bob")


def test_a_bad_token_keeps_the_name_typed(browser: Any, site: Site) -> None:
    page = browser.new_context().new_page()
    page.goto(f"{site.base}/inbox/login")
    page.fill("input[name=token]", "sq_not-a-token")
    page.fill("input[name=actor]", "Ann Example")
    page.click("button[type=submit]")
    assert "the token is not valid" in page.locator(".error").inner_text()
    assert page.input_value("input[name=actor]") == "Ann Example"
    assert page.input_value("input[name=token]") == ""  # a token is never sent back


def test_the_list_fits_a_phone(browser: Any, site: Site, tmp_path: Path) -> None:
    review(site, "p-phone-with-a-rather-long-business-key-0001", amount=1,
           reason="a prompt long enough to wrap over several lines on a phone's screen")
    review(site, "p-phone-2", amount=2, reason="pens")
    page = signed_in(browser, site, ACME, "ann", viewport={"width": 390, "height": 844})
    page.goto(f"{site.base}/inbox")
    assert page.locator("tr.item").count() == 2
    page.screenshot(path=str(tmp_path / "inbox-390.png"), full_page=True)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    page.locator("tr.item a.open").first.click()
    page.screenshot(path=str(tmp_path / "detail-390.png"), full_page=True)
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390


def test_caller_values_render_as_text(browser: Any, site: Site) -> None:
    run = review(site, "p-evil", amount=1, reason=EVIL)
    page = signed_in(browser, site, ACME, EVIL)
    for url in (f"{site.base}/inbox", detail_url(site, run)):
        page.goto(url)
        assert EVIL in page.locator(".prompt").first.inner_text()
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0
    assert json.dumps(EVIL) in page.locator("pre.input").inner_text()  # the input, as JSON
    assert EVIL in page.locator(".signout span").inner_text()


def test_another_tenant_never_sees_the_item(browser: Any, site: Site) -> None:
    run = review(site, "p-private", amount=9, reason="secret")
    page = signed_in(browser, site, GLOBEX, "eve")
    assert page.locator(f"tr.item[data-execution='{run}']").count() == 0
    answer = page.goto(detail_url(site, run))
    assert answer.status == 404 and "secret" not in page.content()


def test_forms_need_their_csrf_token_and_pages_carry_a_csp(site: Site) -> None:
    with httpx.Client(base_url=site.base) as http:
        login = http.get("/inbox/login")
        assert "script-src 'self'" in login.headers["content-security-policy"]
        forged = http.post("/inbox/login", data={"token": ACME, "actor": "mallory",
                                                 "csrf": "guess"})
        assert forged.status_code == 403 and "shardq_token" not in forged.cookies
        signed = http.post("/inbox/login", data={"token": ACME, "actor": "ann",
                                                 "csrf": http.cookies["shardq_csrf"]})
        assert signed.status_code == 303
        run = review(site, "p-csrf", amount=2, reason="pens")
        cross = http.post(f"/inbox/runs/{run}/interrupts/manager_review",
                          data={"action": "approve", "decision_id": "x", "csrf": "nope"})
        assert cross.status_code == 403
        assert site.client.get(run, tenant="acme").state is State.INPUT_REQUIRED


def test_parked_runs_show_their_wait_and_buffered_signals(browser: Any, site: Site) -> None:
    runs = [site.client.start("park", f"parked-{i}", tenant="acme").execution_id
            for i in range(3)]
    wait_until(lambda: all(site.client.get(r, tenant="acme").state is State.WAITING
                           for r in runs), what="parked")
    site.client.signal(runs[1], "other", {"n": 1}, tenant="acme")  # buffered: waits on go
    page = signed_in(browser, site, ACME, "ann")
    page.goto(f"{site.base}/inbox/parked")
    rows = {run: page.locator(f"tr.parked[data-execution='{run}']").inner_text()
            for run in runs}
    assert all("signal go" in text for text in rows.values())
    assert 'other {"n": 1}' in rows[runs[1]] and "none" in rows[runs[0]]
    page.locator(f"tr.parked[data-execution='{runs[1]}'] a").click()
    assert "signal.received" in page.locator("ol.history").inner_text()
    other = signed_in(browser, site, GLOBEX, "eve")
    other.goto(f"{site.base}/inbox/parked")
    assert other.locator("tr.parked").count() == 0


def test_a_runs_page_shows_its_children_and_its_parent(
    browser: Any, site: Site, relay: Callable[..., Any],
) -> None:
    relay()  # a child may live on the other shard
    run = site.client.start("family", "fam", {"tag": EVIL}, tenant="acme").execution_id
    assert site.client.wait(run, timeout=30, tenant="acme").state is State.COMPLETED
    page = signed_in(browser, site, ACME, "ann", viewport={"width": 390, "height": 844})
    page.goto(f"{site.base}/inbox/runs/{run}")
    children = page.locator("tr.child")
    assert children.count() == 2
    first = children.first.inner_text()
    assert "noop" in first and f"fam.{EVIL}.0" in first and "completed" in first, first
    assert page.evaluate("window.__xss") is None and page.locator("main img").count() == 0
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    children.first.locator("a").click()
    assert str(run) in page.locator("p.parent").inner_text()
    page.locator("p.parent a").click()
    page.wait_for_url(f"{site.base}/inbox/runs/{run}")
    other = signed_in(browser, site, GLOBEX, "eve")
    answer = other.goto(f"{site.base}/inbox/runs/{run}")
    assert answer.status == 404 and EVIL not in other.content()


def test_schedules_show_their_clock_and_last_run_to_their_tenant_only(
    browser: Any, site: Site,
) -> None:
    site.client.create_schedule("yearly", "noop", cron="0 0 1 1 *", timezone="Europe/Paris",
                                tenant="acme")
    site.client.create_schedule("often", "noop", every=3600, tenant="acme")
    site.client.pause_schedule("often", tenant="acme")
    site.client.trigger_schedule("yearly", tenant="acme")
    wait_until(lambda: site.client.schedule("yearly", tenant="acme").last_run,
               timeout=30, what="the triggered run")
    page = signed_in(browser, site, ACME, "ann", viewport={"width": 390, "height": 844})
    page.goto(f"{site.base}/inbox/schedules")
    yearly = page.locator("tr.schedule[data-schedule='yearly']").inner_text()
    assert "0 0 1 1 *" in yearly and "Europe/Paris" in yearly and "1 started" in yearly
    often = page.locator("tr.schedule[data-schedule='often']").inner_text()
    assert "paused" in often and "every 3600" in often
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    page.locator("tr.schedule[data-schedule='yearly'] a").click()
    assert "noop" in page.locator("h1").inner_text()
    other = signed_in(browser, site, GLOBEX, "eve")
    other.goto(f"{site.base}/inbox/schedules")
    assert other.locator("tr.schedule").count() == 0
    bad = other.goto(f"{site.base}/inbox/schedules?after=%00")
    assert bad.status == 400 and "Traceback" not in other.content()
