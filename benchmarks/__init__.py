"""Benchmarks, one sub-package per thing measured; each runs as ``python -m benchmarks.<group>.<name>``.

common.py (timing summaries, tmpfs mounts, the one JSON writer) and busy_neighbours.py (rank
processes looping prefill-size lookups beside the one measured) serve every group.  A group imports
those and the packages, not another group (tests/unit/test_import_graph.py names the one
exception it allows).
"""
