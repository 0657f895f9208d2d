"""The study report's statistics: paired confidence intervals and the flattening criterion."""

import numpy as np
import pytest

from experiments.study.report import late_gain, paired_interval


def test_paired_interval_is_the_t_interval_of_the_differences():
    mean, lo, hi = paired_interval(np.array([1.0, 2.0, 3.0]))
    half = 4.302652729911275 * 1.0 / np.sqrt(3)  # t(0.975, 2) * sd / sqrt(n)
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - half, 2.0 + half))
    assert np.isnan(paired_interval(np.array([0.5]))[1])


def test_late_gain_reads_the_last_third_of_the_curve():
    evals = np.array([[0, 0.1], [300, 0.5], [600, 0.6], [900, 0.64]])
    runs = [{"evals": evals}, {"evals": evals + [0, 0.02]}]
    assert late_gain(runs, 900) == pytest.approx(0.04)


def test_step_rule_cells_are_fresh_evaluation_cells_with_their_own_docs_block(tmp_path):
    from experiments.study import main as study
    from experiments.study.report import update_readme

    full = {c.folder for c in study.GRIDS["full"].cells}
    for cell in study.GRIDS["steprules"].cells:
        assert cell.role == "evaluation" and cell.optimizer in ("sgd", "adam")
        assert cell.folder not in full  # never mistaken for a finished run of the full grid
    page = tmp_path / "study.md"
    page.write_text(
        "a\n<!-- study:begin -->\nold full\n<!-- study:end -->\n<!-- study-steprules:begin -->\n"
        "old\n<!-- study-steprules:end -->\nz\n"
    )
    table = tmp_path / "table.md"
    table.write_text("# title\n\n## cell\nnew rows\n")
    _, block = study.DOCS_BLOCKS["steprules"]
    update_readme(page, table, f"<!-- {block}:begin -->", f"<!-- {block}:end -->")
    text = page.read_text()
    assert "old full" in text and "### cell\nnew rows" in text and "\nold\n" not in text


def test_each_evaluation_grid_runs_cells_no_other_grid_ran():
    """An evaluation cell that informed a rule cannot judge it: the cells of v31 (the frozen
    efficiency test) appear in no other grid, and every docs block the study writes exists."""
    from pathlib import Path

    from experiments.study import main as study

    others = {c.folder for name, g in study.GRIDS.items() if name != "v31" for c in g.cells}
    for cell in study.GRIDS["v31"].cells:
        assert cell.role == "evaluation" and cell.optimizer in ("sgd", "adam")
        assert cell.folder not in others
    assert all(c.role == "design" for c in study.GRIDS["v3"].cells)
    v4 = {c.folder for c in study.GRIDS["v4"].cells}  # the hybrid trainer's study: cells of its own
    assert not v4 & {c.folder for name, g in study.GRIDS.items() if name != "v4" for c in g.cells}
    for where, block in study.DOCS_BLOCKS.values():
        page = (Path(study.ROOT) / where).read_text()
        assert f"<!-- {block}:begin -->" in page and f"<!-- {block}:end -->" in page
