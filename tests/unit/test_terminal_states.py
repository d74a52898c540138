"""The terminal states have one definition (core.models.TERMINAL_STATES); every SQL file
that lists them (index predicates, functions, queries) lists exactly those.

A state added to the enum and forgotten in one predicate would leave runs that are
finished for Python and running for SQL (or the reverse): this finds the list.
"""

from __future__ import annotations

import re
from pathlib import Path

from shardq.core.models import TERMINAL_STATES

ROOT = Path(__file__).resolve().parents[2]
SQL_FILES = [ROOT / "schema" / "current.sql",
             *sorted((ROOT / "schema" / "functions").glob("*.sql")),
             *sorted(ROOT.glob("*/queries.sql"))]
LIST = re.compile(r"(?:IN\s*\(|ARRAY\[)([^()\[\]]*'(?:run\.)?completed'[^()\[\]]*)[)\]]", re.I)
QUOTED = re.compile(r"'([a-z_.]+)'")


def lists_of_terminal_states() -> list[tuple[str, set[str]]]:
    found = []
    for path in SQL_FILES:
        for match in LIST.finditer(path.read_text()):
            found.append((path.name, set(QUOTED.findall(match.group(1)))))
    return found


def test_every_sql_list_of_terminal_states_is_the_python_one() -> None:
    states = {s.value for s in TERMINAL_STATES}
    found = lists_of_terminal_states()
    assert len(found) >= 8, found  # the scan still sees the predicates it guards
    for where, listed in found:
        prefixed = all(v.startswith("run.") for v in listed)
        expected = {f"run.{s}" for s in states} if prefixed else states
        assert listed == expected, f"{where} lists {sorted(listed)}"
