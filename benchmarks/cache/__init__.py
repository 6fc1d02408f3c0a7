"""The HBM hot-row cache: hit rate on text, its policy replayed, lookup time and many ranks with and
without it, distinct rows per call of the text workload."""
