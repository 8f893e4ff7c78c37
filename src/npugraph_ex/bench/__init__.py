"""Benchmark helpers and the ``npugraph-ex bench`` command.

Each module holds one idea: ``presets`` (the Qwen3 configs), ``models`` (a preset or a local
checkpoint, as ``--model`` names it), ``precision`` (the dtypes and the agreement with eager each
allows), ``environment`` (where a figure was measured), ``timing`` (interleaved repeats, median
and spread), ``tables`` and ``records`` (the Markdown and JSON output), ``plotting`` (bar charts,
matplotlib imported lazily), ``graphs`` (reading the capture managers a compiled function made),
``memory``, ``progress``; then the command itself: ``variants``, the workloads (``workload``,
``growing``, ``decode``, ``one_token``), ``runner``, ``command`` and ``output``, the one module
that prints.

The scripts in the repository's ``benchmarks/`` folder import the shared helpers from here.
Importing this package imports torch but not transformers or matplotlib.
"""

from __future__ import annotations
