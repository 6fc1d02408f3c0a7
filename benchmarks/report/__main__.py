"""python -m benchmarks.report docs/results/*.json --write docs/BENCHMARKS.md (page.py)."""
from benchmarks.report.page import main

main()
