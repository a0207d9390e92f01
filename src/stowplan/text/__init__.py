"""The words stowplan writes: messages, and text embedded in shell scripts.

* :mod:`~stowplan.text.wording` — counts and nouns, short node ids;
* :mod:`~stowplan.text.shell` — shell quoting, one-line comments, heredoc markers.
"""
