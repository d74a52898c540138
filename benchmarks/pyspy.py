"""Summaries of py-spy raw (collapsed) stack files: where a worker's samples went.

`python -m shardq.benchmarks.pyspy FILE...` prints the top functions by self and by
inclusive samples, and the share of samples per thread role (claim loop, turn
threads, completer, heartbeat). The suite writes such files with
`--py-spy DIR` (py-spy must be installed: `pip install py-spy`).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
_ROLES = (
    ("Completer._run", "completer"),
    ("Worker._claim_loop", "claim loop"),
    ("Worker._turn_loop", "turn threads"),
    ("Worker._heartbeat_loop", "heartbeat"),
)


def _name(frame: str) -> str:
    match = _FRAME.match(frame)
    if not match:
        return frame
    return f"{match['fn']} ({Path(match['file']).name})"


def summarize(paths: Iterable[Path], top: int = 15) -> dict[str, Any]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    total = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_name(f) for f in stack.split(";")]
            total += count
            own[frames[-1]] += count
            for name in set(frames):
                inclusive[name] += count
            role = next((r for marker, r in _ROLES if marker in stack), "other")
            roles[role] += count

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": k, "samples": v, "pct": round(100 * v / total, 1)}
                for k, v in counter.most_common(top)]

    return {
        "samples": total,
        "by_role_pct": {k: round(100 * v / total, 1) for k, v in roles.most_common()} if total
        else {},
        "top_self": share(own) if total else [],
        "top_inclusive": share(inclusive) if total else [],
    }


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m shardq.benchmarks.pyspy RAW_FILE...", file=sys.stderr)
        return 2
    result = summarize(Path(a) for a in argv)
    print(f"{result['samples']} samples; by thread role: {result['by_role_pct']}")
    for key in ("top_self", "top_inclusive"):
        print(f"\n{key.replace('_', ' ')}:")
        for row in result[key]:
            print(f"  {row['pct']:5.1f}%  {row['samples']:6d}  {row['function']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
