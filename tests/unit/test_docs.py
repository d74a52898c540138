"""The documentation site's generated parts, and what the README promises CI.

`mkdocs build --strict` (bin/test.sh) checks links, pages and docstrings; these
check what a build cannot see: that docs/performance.md is what its saved
benchmark result generates (nobody edited a figure by hand), and that the test
command the README names is the one CI runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from shardq.benchmarks.page import DRAIN_PNG, SHARDS_PNG, WAKE_PNG, page
from shardq.benchmarks.report import page_command

from ..support import ROOT

DOCS = ROOT / "docs"
RESULT = DOCS / "benchmarks" / "result.json"
PERFORMANCE = DOCS / "performance.md"


def _scaling() -> list[Path]:
    """The per-shard-count results, in the order the page was written with: by shard count."""
    found = sorted(DOCS.glob("benchmarks/shards-*.json"),
                   key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    return [p.relative_to(ROOT) for p in found]


def test_the_performance_page_is_generated_from_the_saved_result() -> None:
    scaling = _scaling()
    command = page_command(RESULT.relative_to(ROOT), PERFORMANCE.relative_to(ROOT), scaling)
    expected = page(json.loads(RESULT.read_text()),
                    [(p.relative_to("docs").as_posix(), json.loads((ROOT / p).read_text()))
                     for p in scaling],
                    result_link="benchmarks/result.json", command=command)
    assert PERFORMANCE.read_text() == expected, (
        f"docs/performance.md is not what its saved result generates: run `{command}` "
        "(never edit the page by hand)")


def test_the_plots_the_performance_page_shows_exist() -> None:
    text = PERFORMANCE.read_text()
    shown = set(re.findall(r"\]\(([^)]+\.png)\)", text))
    assert shown <= {DRAIN_PNG, WAKE_PNG, SHARDS_PNG}
    for name in shown:
        assert (DOCS / name).is_file(), name


def test_every_page_in_the_nav_exists() -> None:
    nav = re.findall(r":\s+([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    generated = {"http-api-reference.md"}  # made at build time by docs/_hooks/generated.py
    missing = [p for p in nav if p not in generated and not (DOCS / p).is_file()]
    assert nav and not missing, missing


def test_the_readme_names_the_test_command_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^bash bin/test\.sh\b", readme, re.M), "README lost its test command"
    assert re.search(r"^bash bin/test\.sh\s*$", ci, re.M), ".ci/run no longer runs it"
    assert re.search(r"^bash bin/demo\.sh\b", readme, re.M), "README lost its demo command"



COUNTS = ("zero", "one", "two", "three", "four", "five", "six")
ORDINALS = ("zeroth", "first", "second", "third", "fourth", "fifth", "sixth", "seventh")
DEMO_PAGES = ("README.md", "docs/index.md", "docs/tutorial.md", "docs/development.md")
"""Where a reader is told what the demo starts: each says it in the same words."""


def test_the_docs_give_the_demo_s_own_number_of_servers() -> None:
    """bin/demo.py is the truth: it starts `--shard-count` servers, one shard each, then
    adds one more. The pages said three shards, two, or one server holding three."""
    from shardq.bin.demo import main

    (start,) = [p.default for p in main.params if p.name == "shard_count"]
    assert isinstance(start, int)
    for doc in DEMO_PAGES:
        text = " ".join((ROOT / doc).read_text().split())  # a phrase may span lines
        started = re.findall(r"\b(\w+) throw-away PostgreSQL servers?\b", text)
        grown = re.findall(r"\bonto a (\w+) server\b", text)
        assert started and set(started) == {COUNTS[start]}, (doc, started)
        assert grown and set(grown) == {ORDINALS[start + 1]}, (doc, grown)
        assert not re.search(r"\b(?:one|two|three|four) shards? (?:databases )?(?:of its own"
                             r"|in it)", text), doc


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move detail into docs/"


def test_every_demo_page_tells_a_wheel_user_the_demo_s_module() -> None:
    """`bash bin/demo.sh` needs a checkout; a wheel install has only the module, and a reader
    who installed the wheel must find how to run the demo from where they landed."""
    for doc in DEMO_PAGES:
        text = " ".join((ROOT / doc).read_text().split())
        assert "python -m shardq.bin.demo" in text, doc
