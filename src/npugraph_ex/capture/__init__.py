"""Device-independent capture policy: graph keys, static inputs, limits, fallbacks, counters."""
