"""Rendering of plans for people: terminal tables (rich) and HTML."""
