"""The pre-registered ZO study (`make paper`, `python -m experiments.study`): main.py the grids and
runs, report.py its report, v5_bounds.py the v5 cells."""
