"""schema/functions/: one function per file, and no current caller of a function marked to go.

A function kept only for the processes of the release before carries a line
`-- retire: NNNN_words.sql` in its file, naming the migration that drops it
(docs/storage.md, "SQL functions and rolling deploys"). A body or a statement that
calls it would break when that migration runs, and meanwhile gets the old version's
answer.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..support import ROOT, query_files

SCHEMA = ROOT / "schema"
CALLERS = query_files()
"""Every statement file the product runs statements from: found by glob, so a new one
is checked without being listed."""
_CREATE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+shardq\.(\w+)", re.IGNORECASE)
_CALL = re.compile(r"\bshardq\.(\w+)\s*\(", re.IGNORECASE)
_RETIRE = re.compile(r"^-- retire: (\d{4}_[a-z0-9_]+\.sql)\s*$", re.MULTILINE)


def _code(sql: str) -> str:
    """The text without its `--` comments, so naming a function in prose is no call."""
    return re.sub(r"--[^\n]*", "", sql)


def retirement_problems(schema: Path, callers: list[Path]) -> list[str]:
    """Calls of a marked function from outside the marked files, and marks whose
    migration does not drop their function."""
    files = sorted((schema / "functions").glob("*.sql"))
    marked = {}
    for path in files:
        found = _RETIRE.findall(path.read_text())
        if found:
            marked[path.stem] = found[0]
    problems = []
    for name, migration in sorted(marked.items()):
        dropper = schema / migration
        if not dropper.is_file() or not re.search(
            rf"DROP\s+FUNCTION\s+IF\s+EXISTS\s+shardq\.{name}\s*\(", dropper.read_text()
        ):
            problems.append(f"functions/{name}.sql: {migration} does not drop shardq.{name}")
    for path in [*files, *callers]:
        if path.stem in marked and path.parent.name == "functions":
            continue
        called = set(_CALL.findall(_code(path.read_text()))) - set(_CREATE.findall(
            path.read_text()))
        problems += [f"{path.relative_to(path.parents[1])} calls shardq.{name}, marked "
                     f"to be dropped by {marked[name]}" for name in sorted(called & set(marked))]
    return problems


def test_each_function_file_creates_the_one_function_it_is_named_after() -> None:
    for path in sorted((SCHEMA / "functions").glob("*.sql")):
        assert _CREATE.findall(_code(path.read_text())) == [path.stem], path.name


def test_no_current_function_or_statement_calls_a_function_marked_for_retirement() -> None:
    assert retirement_problems(SCHEMA, CALLERS) == []


def test_a_call_of_a_marked_function_is_found(tmp_path: Path) -> None:
    shutil.copytree(SCHEMA, tmp_path / "schema")
    functions = tmp_path / "schema" / "functions"
    body = (functions / "deliver_signals.sql").read_text()
    (functions / "deliver_signals.sql").write_text(
        "-- retire: 0099_drop_deliver_signals.sql\n" + body)
    queries = tmp_path / "queries.sql"
    queries.write_text("-- name: x\n-- shardq.run_state() in prose is no call\n"
                       "SELECT * FROM shardq.deliver_signals(%(a)s)\n")
    callers = [f"functions/{name}.sql" for name in (
        "commit_turns_v2", "deliver_control", "send_control",
        "signal_with_start_v2")] + [f"{tmp_path.name}/queries.sql"]
    calls = [f"{caller} calls shardq.deliver_signals, marked to be dropped by "
             "0099_drop_deliver_signals.sql" for caller in callers]
    assert retirement_problems(tmp_path / "schema", [queries]) == [
        "functions/deliver_signals.sql: 0099_drop_deliver_signals.sql does not drop "
        "shardq.deliver_signals", *calls]
    (tmp_path / "schema" / "0099_drop_deliver_signals.sql").write_text(
        "DROP FUNCTION IF EXISTS shardq.deliver_signals(text);\n")
    assert retirement_problems(tmp_path / "schema", [queries]) == calls
