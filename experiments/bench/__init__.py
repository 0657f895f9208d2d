"""The speed benchmark (`make bench`, `python -m experiments.bench`): main.py its command line and
sections, the rest one section or helper each."""
