"""Helpers shared by the test modules: paths, strategies, hand-built plans and hosts.

Test modules import shared code from here only, never from a ``conftest`` or from
another test module; ``conftest`` files hold fixtures and hooks.
"""
