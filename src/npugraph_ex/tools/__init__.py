"""The tools a user runs on top of the backend: ``bisect`` (which layer changes a result, and
where) and ``compare_dumps`` (where two tensor dumps part ways), and their ``npugraph-ex``
subcommands. They drive the whole stack, so nothing below imports them."""

from __future__ import annotations

from npugraph_ex.tools.bisection import bisect
from npugraph_ex.tools.compare import compare_dumps

__all__ = ["bisect", "compare_dumps"]
