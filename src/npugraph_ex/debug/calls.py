"""Call selections as TorchAir writes dump steps: ``"0|2-4"`` is calls 0, 2, 3 and 4."""

from __future__ import annotations

import re

CALL_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_calls(spec: str) -> list[tuple[int, int]]:
    """``"0|2-4"`` as inclusive ranges ``[(0, 0), (2, 4)]``; ``""`` as no ranges (every call).
    Raises ValueError naming the part it cannot read."""
    ranges = []
    for part in spec.replace(" ", "").split("|") if spec.strip() else ():
        match = CALL_RANGE.match(part)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ValueError(f"cannot read {part!r}: write calls as 'N' or 'N-M' joined by '|'")
        ranges.append((int(match[1]), int(match[2] or match[1])))
    return ranges
