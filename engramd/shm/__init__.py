"""The table's home in the shm dir: table files (naming, space, reservation, publication, re-adoption:
``table_files.py``), the daemon's own directory inside a shared shm dir, the directory's file system and
page size, NUMA placement.

Must not import: ``engramd.daemon``, ``engramd.loading``, ``engramd.cli``, ``engramd.synth``.
"""
