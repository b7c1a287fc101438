"""Fuzz cases, one file per package module (tests/unit/test_fuzz.py imports them all)."""
