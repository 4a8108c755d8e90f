"""spark-submit's primary resource in the segtxn-verify image (/opt/segtxn/check.py): the
``segtxn`` command with the arguments given, e.g. ``verify check --master=k8s://…``.
spark-submit runs only a file ending in ``.py`` as a Python application; this is that file.
"""

from segtxn.cli import main

main()
