"""The model zoo: many architectures from ``transformers`` (random weights, from a config)
checked against eager.

    models      the table of architectures (``ZOO``)
    checks      the checks of one model: forward, generate, dynamic batches
    background  the kernel tier's check of one model
    table       the writer of ``docs/zoo.md`` (``python -m zoo.table --out docs/zoo.md``)

``tests/e2e/test_zoo.py`` asserts on the checks (``make zoo``).
"""
