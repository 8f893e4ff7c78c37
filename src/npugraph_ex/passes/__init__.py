"""FX graph passes, one per file, run in the order written once in ``pipeline.PIPELINE``."""
