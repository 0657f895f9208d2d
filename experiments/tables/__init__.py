"""The measurements behind the docs' tables, one module each (python -m experiments.tables.NAME)."""
