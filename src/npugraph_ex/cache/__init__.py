"""The compile cache behind ``npugraph_ex.inference.cache_compile`` (see ``method``)."""
