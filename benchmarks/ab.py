"""`python -m shardq.benchmarks.ab BASE [HEAD] --rounds N [--scenario S,...] [-- suite args]`.

Two builds of shardq measured against each other in one run, their rounds
alternated (ABBA by default), because on a shared two-core machine a figure
drifts by more than most changes move it: only rounds of both sides taken in
the same minutes compare.

BASE and HEAD are git revisions; without HEAD the other side is the working
tree as it is now, uncommitted and untracked (not ignored) files included. The
checkout, its index and its stashes are only read: a revision is exported with
`git archive REV | tar -x`, the working tree copied file by file from `git
ls-files`. Each side gets its own temporary directory with the repository's
`.pkgroot/shardq` symlink, and every round runs that tree's own suite
(`python -m shardq.benchmarks ... --json`) in a subprocess with
`PYTHONPATH=DIR/.pkgroot`, so each side runs its own code, its own workers and
its own schema on databases the suite creates and drops for the round.

Isolation: `shardq` is a namespace package, so `PYTHONPATH` alone would make it
span the exported tree *and* the checkout that the virtualenv's editable install
puts on `sys.path` (benchmarks/README.md, "Comparing commits"). Each exported tree
therefore gets an empty `__init__.py` at its root, i.e. `shardq/__init__.py`: a
regular package found first on the path ends the search, and every subpackage
then resolves inside that tree alone. A probe checks it before the first round.

Per key of the suites' own headline (numbers only, their names kept; a headline
dict of numbers such as `floor_by_batch` gives `floor_by_batch.100`), the table
shows each side's median and range (min..max) and HEAD/BASE of the medians; keys
whose two ranges overlap are "within noise". `--json` prints the whole document,
every round's numbers included.

Exit codes: 0 every round ran every scenario; 1 a round or a scenario in it
failed (the table still reports the rest); 2 bad arguments (an unknown
revision, a scenario or suite option either side's suite refuses), with one line
on stderr; 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

PROG = "python -m shardq.benchmarks.ab"
WORKTREE = "worktree"
ORDERS = ("abba", "ab")
# Options that would point both sides at the same databases: each round's suite
# creates its own (a newer side's migrations would leave the older side a schema
# it refuses).
FORBIDDEN_SUITE_ARGS = ("--shards", "--wipe")
ENV_DROPPED = ("SHARDQ_SHARDS", "PYTHONPATH")

# Runs inside an exported tree: is `shardq` that tree's alone, and does that tree's
# own suite accept the scenarios and options? One JSON line on stdout.
PROBE = r"""
import contextlib, io, json, sys
import shardq
root = sys.argv[1]
out = {"shardq": list(shardq.__path__)}
try:
    from shardq.benchmarks.__main__ import parser
    from shardq.benchmarks.scenarios import SCENARIOS
except Exception as exc:
    out["error"] = f"its benchmark suite does not load: {type(exc).__name__}: {exc}"
    print(json.dumps(out)); sys.exit(0)
out["scenarios"] = list(SCENARIOS)
scenarios = json.loads(sys.argv[2]); extra = json.loads(sys.argv[3])
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        named = parser().parse_args([*scenarios, *extra]).scenarios
except SystemExit:
    lines = [l for l in err.getvalue().splitlines() if l.strip()]
    out["error"] = "its suite refuses the arguments: " + (
        lines[-1].split("error: ", 1)[-1] if lines else "(no message)")
else:
    unknown = [s for s in named if s != "all" and s not in SCENARIOS]
    if unknown:
        out["error"] = (f"its suite has no scenario {', '.join(unknown)} "
                        f"(it knows all, {', '.join(SCENARIOS)})")
print(json.dumps(out))
"""


class UsageError(Exception):
    """Bad input: reported in one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage block: the caller sees what was wrong at once.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Measure two revisions of shardq against each other in alternated rounds "
                    "of the benchmark suite, in one run.",
        epilog="Arguments after `--` go to the suite of both sides, e.g. `-- --quick "
               "--workers 2`. `%(prog)s HEAD HEAD --rounds 3` measures the noise itself.",
    )
    p.add_argument("base", metavar="BASE", help="git revision of side A")
    p.add_argument("head", metavar="HEAD", nargs="?",
                   help="git revision of side B (default: the working tree as it is now, "
                        "uncommitted changes included)")
    p.add_argument("--rounds", type=_rounds, default=3,
                   help="suite runs per side (default 3)")
    p.add_argument("--scenario", action="append", default=[], metavar="NAME[,NAME]",
                   help="scenario(s) of the suite to run, repeatable or comma-separated "
                        "(default: the suite's own default, all)")
    p.add_argument("--quick", action="store_true", help="pass --quick to the suite")
    p.add_argument("--order", choices=ORDERS, default="abba",
                   help="abba (default: A B B A A B ..., each side first as often, a linear "
                        "drift cancels) or ab (A B A B ...)")
    p.add_argument("--json", action="store_true",
                   help="print the whole document (every round included) instead of the table")
    p.add_argument("--save", type=Path, metavar="DIR",
                   help="also keep each round's full suite result as DIR/round-NN-SIDE.json")
    return p


@dataclass
class Args:
    base: str
    head: str | None
    rounds: int
    scenarios: list[str]
    suite_args: list[str]
    order: str
    json: bool
    save: Path | None


def parse_args(argv: Sequence[str]) -> Args:
    """The command line; `--` starts the suite's own arguments. Exits 2 on bad input."""
    argv = list(argv)
    suite_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, suite_args = argv[:cut], argv[cut + 1:]
    p = parser()
    ns = p.parse_args(argv)
    scenarios = [s.strip() for group in ns.scenario for s in group.split(",") if s.strip()]
    if ns.scenario and not scenarios:
        p.error("--scenario: expected at least one name")
    for arg in suite_args:
        name = arg.split("=", 1)[0]
        if name in FORBIDDEN_SUITE_ARGS:
            p.error(f"{name} is not for ab: each round's suite creates and drops its own "
                    "databases")
    if ns.quick and "--quick" not in suite_args:
        suite_args.insert(0, "--quick")
    return Args(base=ns.base, head=ns.head, rounds=ns.rounds, scenarios=scenarios,
                suite_args=suite_args, order=ns.order, json=ns.json, save=ns.save)


# -- the two trees ----------------------------------------------------------------------


def _git(repo: Path, *args: str,
         stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    # Read-only commands only; GIT_OPTIONAL_LOCKS=0 keeps git from refreshing the
    # index of a checkout others are working in.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    return subprocess.run(["git", "-C", str(repo), *args], stdout=stdout,
                          stderr=subprocess.PIPE, env=env, check=False)


def repository() -> Path:
    """The git checkout this file belongs to."""
    here = Path(__file__).resolve().parent
    done = _git(here, "rev-parse", "--show-toplevel")
    if done.returncode != 0:
        raise UsageError(f"{here} is not inside a git checkout")
    return Path(done.stdout.decode().strip())


def resolve(repo: Path, rev: str) -> str:
    """The full commit id of `rev`, or UsageError."""
    if not rev or rev.startswith("-"):
        raise UsageError(f"unknown revision {rev!r}")
    done = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise UsageError(f"unknown revision {rev!r} (not a commit in {repo})")
    return done.stdout.decode().strip()


@dataclass
class Side:
    """One build under test: a revision (or the working tree) exported to `tree`."""

    name: str  # "base" or "head"
    letter: str  # "A" or "B"
    rev: str  # as given, or "worktree"
    commit: str  # the revision's commit; for the working tree, HEAD under it
    tree: Path = Path()
    uncommitted: list[str] = field(default_factory=list)
    fingerprint: str | None = None

    @property
    def label(self) -> str:
        if self.rev == WORKTREE:
            return f"working tree ({self.commit[:7]} + {len(self.uncommitted)} uncommitted)"
        short = self.commit[:7]
        return self.rev if self.rev.startswith(short) else f"{self.rev} ({short})"

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rev": self.rev, "commit": self.commit, "label": self.label,
                               "engine_fingerprint": self.fingerprint}
        if self.rev == WORKTREE:
            out["uncommitted"] = self.uncommitted
        return out


def export_commit(repo: Path, commit: str, into: Path) -> None:
    into.mkdir(parents=True)
    with subprocess.Popen(["tar", "-x", "-C", str(into)], stdin=subprocess.PIPE,
                          stderr=subprocess.PIPE) as tar:
        archive = _git(repo, "archive", "--format=tar", commit, stdout=tar.stdin)
        assert tar.stdin is not None
        tar.stdin.close()
        tar_err = tar.stderr.read().decode() if tar.stderr else ""
        tar.wait()
    if archive.returncode != 0 or tar.returncode != 0:
        why = archive.stderr.decode().strip() or tar_err.strip()
        raise UsageError(f"exporting {commit[:12]} failed: {why.splitlines()[-1] if why else '?'}")


def _null_list(repo: Path, *args: str) -> list[str]:
    done = _git(repo, "ls-files", "-z", *args)
    if done.returncode != 0:
        raise UsageError(f"git ls-files failed: {done.stderr.decode().strip()}")
    return sorted({p for p in done.stdout.decode().split("\0") if p})


def export_worktree(repo: Path, into: Path) -> list[str]:
    """Copy the tracked and the untracked, not ignored, files as they are on disk now.

    Returns the paths that differ from HEAD (modified, deleted, untracked).
    """
    into.mkdir(parents=True)
    for rel in _null_list(repo, "--cached", "--others", "--exclude-standard"):
        src, dst = repo / rel, into / rel
        if not os.path.lexists(src) or (src.is_dir() and not src.is_symlink()):
            continue  # deleted in the working tree, or a submodule
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)
    return _null_list(repo, "--modified", "--deleted", "--others", "--exclude-standard")


def prepare_tree(tree: Path) -> None:
    """The `.pkgroot/shardq` symlink, and the root `__init__.py` that isolates the tree."""
    link = tree / ".pkgroot" / "shardq"
    if not os.path.lexists(link):
        link.parent.mkdir(exist_ok=True)
        os.symlink("..", link)
    init = tree / "__init__.py"
    if not init.exists():
        init.write_text("# written by shardq.benchmarks.ab: this tree's shardq alone\n")


def side_env(side: Side) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROPPED}
    env["PYTHONPATH"] = str(side.tree / ".pkgroot")
    return env


def probe(side: Side, work: Path, scenarios: list[str], suite_args: list[str]) -> list[str]:
    """Check the side's tree imports alone and its suite accepts the arguments; its scenarios."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(side.tree), json.dumps(scenarios),
         json.dumps(suite_args)],
        env=side_env(side), cwd=work, capture_output=True, text=True, check=False, timeout=120)
    try:
        out = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{side.name} {side.label}: its tree does not import: {last}") from None
    expected = str(side.tree / ".pkgroot" / "shardq")
    if out["shardq"] != [expected]:
        raise UsageError(f"{side.name} {side.label}: shardq is not isolated to its tree "
                         f"(shardq.__path__ = {out['shardq']})")
    if "error" in out:
        raise UsageError(f"{side.name} {side.label}: {out['error']}")
    return list(out["scenarios"])


# -- rounds -----------------------------------------------------------------------------


def schedule(rounds: int, order: str) -> list[int]:
    """Side indexes (0 = base, 1 = head) in running order: 2 x rounds entries."""
    out: list[int] = []
    for i in range(rounds):
        pair = [0, 1] if order == "ab" or i % 2 == 0 else [1, 0]
        out.extend(pair)
    return out


def numbers(headline: dict[str, Any]) -> dict[str, float]:
    """The headline's numeric keys, names kept; a dict of numbers flattens to `key.sub`."""
    out: dict[str, float] = {}
    for key, value in headline.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[key] = value
        elif isinstance(value, dict):
            for sub, inner in value.items():
                if isinstance(inner, int | float) and not isinstance(inner, bool):
                    out[f"{key}.{sub}"] = inner
    return out


class _Interrupted(Exception):
    pass


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted


def run_round(side: Side, work: Path, index: int, scenarios: list[str],
              suite_args: list[str]) -> dict[str, Any]:
    """One run of the side's suite; its numbers, or why there are none."""
    command = [sys.executable, "-m", "shardq.benchmarks", *scenarios, *suite_args,
               "--json", "--no-progress"]
    log = work / f"round-{index:02d}-{side.name}.log"
    started = time.monotonic()
    load = os.getloadavg()[0]
    with open(log, "wb") as err:
        # Its own session: a Ctrl-C reaches the suite once, from here, and never
        # in the middle of the clean-up that drops its databases.
        child = subprocess.Popen(command, env=side_env(side), cwd=work,
                                 stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            stdout, _ = child.communicate()
        except (KeyboardInterrupt, _Interrupted):
            # The suite drops its databases on SIGINT; give it the time to.
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise
    record: dict[str, Any] = {
        "round": index, "side": side.name, "letter": side.letter,
        "exit_code": child.returncode, "duration_s": round(time.monotonic() - started, 1),
        "load_average_1m_at_start": round(load, 2),
    }
    try:
        doc = json.loads(stdout)
    except ValueError:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        record["error"] = tail[-1] if tail else f"exit code {child.returncode}, no output"
        record["numbers"] = {}
        return record
    record["numbers"] = numbers(doc.get("headline", doc))
    record["failures"] = doc.get("failures", {})
    record["suite_total_s"] = doc.get("total_s")
    record["engine_fingerprint"] = (doc.get("environment", {}).get("machine", {})
                                    .get("engine_fingerprint"))
    record["doc"] = doc
    return record


# -- summary ----------------------------------------------------------------------------


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "values": values}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per key, in the suites' order: each side's spread, HEAD/BASE and the noise flag."""
    order: dict[str, None] = {}
    values: dict[str, dict[str, list[float]]] = {}
    for r in rounds:
        for key, value in r["numbers"].items():
            order.setdefault(key)
            values.setdefault(key, {"base": [], "head": []})[r["side"]].append(value)
    out: dict[str, dict[str, Any]] = {}
    for key in order:
        base, head = values[key]["base"], values[key]["head"]
        entry: dict[str, Any] = {"base": spread(base) if base else None,
                                 "head": spread(head) if head else None,
                                 "ratio": None, "within_noise": None}
        if base and head:
            b, h = entry["base"], entry["head"]
            if b["median"]:
                entry["ratio"] = round(h["median"] / b["median"], 3)
            entry["within_noise"] = b["min"] <= h["max"] and h["min"] <= b["max"]
        out[key] = entry
    return out


def _n(value: float) -> str:
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _cell(s: dict[str, Any] | None) -> tuple[str, str]:
    if s is None:
        return "-", ""
    return _n(s["median"]), f"{_n(s['min'])}..{_n(s['max'])}"


def table(doc: dict[str, Any]) -> str:
    base, head = doc["base"], doc["head"]
    lines = [
        f"A = base {base['label']}, engine {base['engine_fingerprint']}",
        f"B = head {head['label']}, engine {head['engine_fingerprint']}",
        f"{doc['rounds_per_side']} round(s) per side, order {doc['sequence']}; suite: "
        f"{' '.join(['python -m shardq.benchmarks', *doc['scenarios'], *doc['suite_args']])}",
        "",
    ]
    rows = [("key", "A median", "A range", "B median", "B range", "B/A", "")]
    for key, e in doc["keys"].items():
        a_med, a_rng = _cell(e["base"])
        b_med, b_rng = _cell(e["head"])
        ratio = "-" if e["ratio"] is None else f"{e['ratio']:.3f}"
        flag = {True: "within noise", False: "differs", None: ""}[e["within_noise"]]
        rows.append((key, a_med, a_rng, b_med, b_rng, ratio, flag))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:-1],
                                                                      strict=True)]
        lines.append("  ".join([*cells, r[-1]]).rstrip())
    lines.append("")
    lines.append("rounds: " + "; ".join(
        f"{r['round']} {r['letter']} {r['duration_s']:.0f} s load {r['load_average_1m_at_start']:g}"
        + (f" FAILED: {r['error']}" if "error" in r else "")
        + (f" failed scenarios: {', '.join(r['failures'])}" if r.get("failures") else "")
        for r in doc["rounds"]))
    if doc["rounds_per_side"] < 2:
        lines.append("one round per side: a range is a single value, so no key can be "
                     "within noise; use --rounds 3 or more")
    lines.append("within noise: the two sides' min..max ranges overlap; B/A is of the medians")
    return "\n".join(lines)


# -- main -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    previous = signal.signal(signal.SIGTERM, _on_term)
    # Started in the background, a shell leaves SIGINT ignored, and a child would
    # inherit that and ignore the SIGINT that asks it to clean up: a handler of our
    # own (any) resets it to the default in every child at exec.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    work: Path | None = None
    try:
        repo = repository()
        sides = [Side("base", "A", args.base, resolve(repo, args.base))]
        if args.head is None:
            head_commit = resolve(repo, "HEAD")
            sides.append(Side("head", "B", WORKTREE, head_commit))
        else:
            sides.append(Side("head", "B", args.head, resolve(repo, args.head)))
        work = Path(tempfile.mkdtemp(prefix="shardq-ab-"))
        for side in sides:
            side.tree = work / side.name
            if side.rev == WORKTREE:
                side.uncommitted = export_worktree(repo, side.tree)
            else:
                export_commit(repo, side.commit, side.tree)
            prepare_tree(side.tree)
            probe(side, work, args.scenarios, args.suite_args)
        return _measure(args, sides, work)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, _Interrupted):
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def _log(message: str) -> None:
    print(f"[ab] {message}", file=sys.stderr, flush=True)


def _measure(args: Args, sides: list[Side], work: Path) -> int:
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    wall = time.monotonic()
    order = schedule(args.rounds, args.order)
    for side in sides:
        _log(f"{side.letter} = {side.name} {side.label}")
    rounds: list[dict[str, Any]] = []
    for index, which in enumerate(order, start=1):
        side = sides[which]
        _log(f"round {index}/{len(order)}: {side.letter} ({side.name}) ...")
        record = run_round(side, work, index, args.scenarios, args.suite_args)
        full = record.pop("doc", None)
        if full is not None and args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"round-{index:02d}-{side.name}.json").write_text(
                json.dumps(full, indent=2, default=str) + "\n")
        if side.fingerprint is None:
            side.fingerprint = record.get("engine_fingerprint")
        rounds.append(record)
        what = record.get("error") or ", ".join(
            f"{k} {_n(record['numbers'][k])}" for k in
            ("drain_jobs_per_s", "durable_floor_jobs_per_s", "cycles_per_s", "wake_p99_ms")
            if k in record["numbers"])
        _log(f"round {index}/{len(order)}: {side.letter} done in {record['duration_s']:.0f} s"
             + (f": {what}" if what else ""))
    doc: dict[str, Any] = {
        "shardq_ab": 1,
        "started_at": started_at,
        "total_s": round(time.monotonic() - wall, 1),
        "base": sides[0].describe(),
        "head": sides[1].describe(),
        "rounds_per_side": args.rounds,
        "order": args.order,
        "sequence": " ".join(sides[i].letter for i in order),
        "scenarios": args.scenarios,
        "suite_args": args.suite_args,
        "keys": summarize(rounds),
        "rounds": rounds,
    }
    print(json.dumps(doc, default=str) if args.json else table(doc))
    failed = any("error" in r or r.get("failures") for r in rounds)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
