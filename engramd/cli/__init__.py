"""The command line: the group and its small commands (``main.py``), ``serve``, ``status`` and ``stop``,
the one exception-to-``error:`` mapper (``error_map.py``), the extra each command needs, "no daemon there"
answered at once, serve's settings.  It sits on top and may import any folder.

Imported only by: ``engramd.__main__`` (and the console script).
"""
