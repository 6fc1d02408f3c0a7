"""The report: docs/BENCHMARKS.md's head rendered from the benchmarks' JSON under docs/results/.

``page.py`` reads the runs and writes the page between its markers; ``measures.py`` turns each run
into table rows and holds the targets.  Imports no benchmark group: it reads their JSON only.
"""
