"""The command lines and their plumbing: cli.py (`npusim`), resident.py (its entry point and resident
server), golden, compare, validate, inspect, and the atomic outputs, interrupts and display of names
that npusim and zo share."""
