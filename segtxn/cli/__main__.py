"""``python -m segtxn.cli`` is the ``segtxn`` command."""

from segtxn.cli import main

main()
