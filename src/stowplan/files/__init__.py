"""Files a user names, read within bounds; files stowplan writes, written atomically.

* :mod:`~stowplan.files.fileio` — bounded reads of user files, atomic writes;
* :mod:`~stowplan.files.safeload` — bounded parsing of JSON and YAML text;
* :mod:`~stowplan.files.fleets` — fleet files and provider offer lists, read as nodes.
"""
