"""The run explorer (`/inbox/runs`) in a real browser: Debian's chromium driven by
playwright, against a real `shardq serve` process and a real worker, as an operator
uses it: find runs by state, workflow and attributes with their counts, read a run's
timeline, its attributes and the signals on their way to and from it, and signal or
cancel it from its page."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import httpx

from shardq.core.models import State

from ..support import wait_until
from .test_inbox import (  # noqa: F401 - the fixtures
    ACME,
    EVIL,
    GLOBEX,
    Site,
    browser,
    pytestmark,
    signed_in,
    site,
)


def tagged(at: Site, key: str, region: str, amount: float) -> str:
    """A `tagged` run of acme's, parked on "go" with its attributes set."""
    run = at.client.start("tagged", key, {"region": region, "amount": amount},
                          tenant="acme").execution_id
    wait_until(lambda: at.client.get(run, tenant="acme").state is State.WAITING,
               what="the run parked")
    return str(run)


def listed(page: Any) -> list[str]:
    return [row.get_attribute("data-execution") for row in page.locator("tr.run").all()]


def test_runs_are_found_by_state_workflow_and_attribute_with_their_counts(
    browser: Any, site: Site,  # noqa: F811
) -> None:
    eu = [tagged(site, f"eu-{i}", "eu", i) for i in range(2)]
    us = tagged(site, "us-0", "us", 5)
    done = site.client.start("noop", "done", tenant="acme").execution_id
    site.client.wait(done, tenant="acme", timeout=15)
    page = signed_in(browser, site, ACME, "ann")
    page.goto(f"{site.base}/inbox/runs")
    assert listed(page) == sorted([*eu, us, str(done)])
    counts = page.locator("nav.counts").inner_text()
    assert "4 runs" in counts and "waiting 3" in counts and "completed 1" in counts
    page.fill("textarea[name=where]", "region=eu\namount>=0")
    page.click("form.runs-filters button[type=submit]")
    assert listed(page) == sorted(eu)
    # Counting by attributes reads every run they match: only when asked.
    assert "4 runs of every workflow, attributes aside" in page.locator(
        "nav.counts").inner_text()
    page.click("a.count-matching")
    assert "2 runs matching" in page.locator("nav.counts").inner_text()
    assert listed(page) == sorted(eu) and page.locator("a.count-matching").count() == 0
    assert '"eu"' in page.locator("tr.run").first.inner_text()
    page.goto(f"{site.base}/inbox/runs?workflow=noop")
    assert listed(page) == [str(done)]
    page.goto(f"{site.base}/inbox/runs")
    page.locator("nav.counts a.state-waiting").click()
    assert sorted(listed(page)) == sorted([*eu, us])
    assert page.locator("select[name=state]").input_value() == "waiting"
    refused = page.goto(f"{site.base}/inbox/runs?where=region%3E%3Eeu")
    assert refused.status == 400 and "is not NAME OP VALUE" in page.content()


def test_a_runs_page_shows_its_timeline_and_signals_and_cancels_it(
    browser: Any, site: Site,  # noqa: F811
) -> None:
    run, other = tagged(site, "act-0", "eu", 12.5), tagged(site, "act-1", "us", 1)
    page = signed_in(browser, site, ACME, "ann")
    page.goto(f"{site.base}/inbox/runs/{run}")
    assert "region" in page.locator("dl.attributes").inner_text()
    assert "Waits on signal go" in page.locator("p.wait").inner_text()
    kinds = [e.get_attribute("data-kind") for e in page.locator("ol.timeline li").all()]
    assert kinds[:2] == ["attributes.set", "signal.waiting"]
    assert 'amount=12.5, region="eu"' in page.locator("ol.timeline li").first.inner_text()
    page.fill("form.signal input[name=name]", "go")
    page.fill("form.signal textarea[name=payload]", '{"approved": true}')
    page.click("form.signal button[type=submit]")
    page.wait_for_url(f"{site.base}/inbox/runs/{run}")
    assert site.client.wait(run, tenant="acme", timeout=15).output == {"approved": True}
    page.reload()
    assert "run.completed" in page.locator("ol.timeline").inner_text()
    assert page.locator("form.signal, form.cancel").count() == 0  # an ended run: no actions
    page.goto(f"{site.base}/inbox/runs/{other}")
    page.click("form.cancel button")
    page.wait_for_url(f"{site.base}/inbox/runs/{other}")
    assert site.client.get(other, tenant="acme").state is State.CANCELLED
    assert "cancelled" in page.locator("p.meta .state").inner_text()


def test_a_refused_signal_keeps_the_form_and_sends_nothing(
    browser: Any, site: Site,  # noqa: F811
) -> None:
    run = tagged(site, "refused", "eu", 1)
    page = signed_in(browser, site, ACME, "ann")
    for name, payload, says in (("go", '{"a": 1, "a": 2}', "repeats the key 'a'"),
                                ("bad name!", "1", "signal name"),
                                ("go", '"' + "x" * 300_000 + '"', "too large")):
        page.goto(f"{site.base}/inbox/runs/{run}")
        page.fill("form.signal input[name=name]", name)
        page.fill("form.signal textarea[name=payload]", payload)
        page.click("form.signal button[type=submit]")
        page.locator("main").wait_for()
        assert says in page.locator("main").inner_text(), (name, says)
    page.goto(f"{site.base}/inbox/runs/{run}")
    page.fill("form.signal input[name=name]", "bad name!")
    page.fill("form.signal textarea[name=payload]", '{"kept": 1}')
    page.click("form.signal button[type=submit]")
    assert page.locator("form.signal textarea[name=payload]").input_value() == '{"kept": 1}'
    assert site.client.get(run, tenant="acme").state is State.WAITING
    assert site.client.waiting(run, tenant="acme")[1] == []  # nothing buffered either


def test_signals_on_their_way_show_on_both_runs(
    browser: Any, site: Site,  # noqa: F811
) -> None:
    """No relay runs here: a signal to a run of the other shard stays in the outbox, and
    both runs' pages show it, the sender's as sent and the target's as on its way."""
    targets = [site.client.start("park", f"target-{i}", tenant="acme").execution_id
               for i in range(8)]
    sender = site.client.start("tenant_cancel", "sender", {
        "runs": [str(t) for t in targets], "reason": EVIL}, tenant="acme").execution_id
    output = site.client.wait(sender, tenant="acme", timeout=15).output
    assert output["queued"], output  # 8 targets over 2 shards: some on the other one
    queued = output["queued"][0]
    page = signed_in(browser, site, ACME, "ann", viewport={"width": 390, "height": 844})
    page.goto(f"{site.base}/inbox/runs/{sender}")
    sent = page.locator("tr.outbox-row.owes")
    assert sent.count() == len(output["queued"])
    assert "tenant_cancelled" in sent.first.inner_text() and "pending" in sent.first.inner_text()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 390
    page.goto(f"{site.base}/inbox/runs/{queued}")
    owed = page.locator("tr.outbox-row.owed")
    assert owed.count() == 1 and str(sender) in owed.inner_text()


def test_the_explorer_fits_a_phone_and_shows_hostile_text_as_text(
    browser: Any, site: Site,  # noqa: F811
) -> None:
    run = tagged(site, f"evil-{EVIL}", EVIL, 3)
    site.client.signal(run, "other", {"note": EVIL}, tenant="acme")  # buffered: waits on go
    page = signed_in(browser, site, ACME, EVIL, viewport={"width": 390, "height": 844})
    for url in (f"{site.base}/inbox/runs", f"{site.base}/inbox/runs/{run}"):
        page.goto(url)
        assert EVIL in page.locator("main").inner_text()
        assert page.evaluate("window.__xss") is None and page.locator("main img").count() == 0
        assert page.evaluate("document.scrollingElement.scrollWidth") <= 390, url
    page.fill("form.signal input[name=name]", EVIL[:128])  # refused, echoed as text
    page.fill("form.signal textarea[name=payload]", json.dumps(EVIL))
    page.fill("form.signal input[name=idempotency_key]", EVIL)
    page.click("form.signal button[type=submit]")
    assert "signal name" in page.locator("form.signal .refusal").inner_text()
    assert page.locator("form.signal input[name=idempotency_key]").input_value() == EVIL
    assert page.evaluate("window.__xss") is None and page.locator("main img").count() == 0
    # A value that starts with an operator's character is given as a JSON string.
    page.goto(f"{site.base}/inbox/runs?" + urlencode({"workflow": "tagged",
                                                       "where": f"region={json.dumps(EVIL)}"}))
    assert listed(page) == [run]


def test_another_tenant_sees_and_touches_none_of_the_runs(
    browser: Any, site: Site,  # noqa: F811
) -> None:
    run = tagged(site, "private", "secret-region", 1)
    page = signed_in(browser, site, GLOBEX, "eve")
    page.goto(f"{site.base}/inbox/runs")
    assert listed(page) == [] and "secret-region" not in page.content()
    answer = page.goto(f"{site.base}/inbox/runs/{run}")
    assert answer.status == 404 and "secret-region" not in page.content()
    with httpx.Client(base_url=site.base) as http:
        http.get("/inbox/login")
        csrf = http.cookies["shardq_csrf"]
        assert http.post("/inbox/login", data={"token": GLOBEX, "actor": "eve",
                                                "csrf": csrf}).status_code == 303
        for action, form in (("cancel", {}), ("signal", {"name": "go", "payload": "1"})):
            refused = http.post(f"/inbox/runs/{run}/{action}", data={"csrf": csrf, **form})
            assert refused.status_code == 404, (action, refused.text[-300:])
        forged = http.post(f"/inbox/runs/{run}/cancel", data={"csrf": "guess"})
        assert forged.status_code == 403
    assert site.client.get(run, tenant="acme").state is State.WAITING
