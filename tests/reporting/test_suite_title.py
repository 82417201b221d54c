"""A suite's ``title``: validated, read by the report's ablation figure from the suite that
lists the ablation tables, and no part of any run id."""

from __future__ import annotations

import pytest

from harness.config.schema import ConfigError
from harness.experiments.runner import SuiteRunner
from harness.experiments.suites import load_suite
from harness.reporting.report import ablation_heading


def test_the_ablation_suite_titles_its_figure_and_its_protocols_report_finds_it():
    assert load_suite("tinybert-ablation").title == "TinyBERT ablations"
    glue_cpu = load_suite("glue-cpu")
    assert glue_cpu.title is None
    assert ablation_heading(glue_cpu, {"procedure", "mapping"}) == (
        "TinyBERT ablations", "tinybert-ablation")
    # tables no suite of the protocol lists: a heading that names no suite
    assert ablation_heading(glue_cpu, {"unlisted"}) == ("Published ablations", "ablations")


def test_a_suite_that_lists_the_tables_without_a_title_is_named(tiny_suite_file):
    tiny = load_suite(str(tiny_suite_file), ["anchor_groups=[procedure]"])
    assert ablation_heading(tiny, {"procedure"}) == (tiny.name, tiny.name)
    titled = load_suite(str(tiny_suite_file), ["anchor_groups=[procedure]", "title=Mine"])
    assert ablation_heading(titled, {"procedure"}) == ("Mine", tiny.name)


@pytest.mark.parametrize("value", ["''", '"two\\nlines"', "'" + "x" * 81 + "'"])
def test_a_title_is_one_short_line(tiny_suite_file, value):
    with pytest.raises(ConfigError, match="title"):
        load_suite(str(tiny_suite_file), [f"title={value}"])


@pytest.mark.e2e
def test_a_title_changes_no_run_id(tiny_suite_file, tmp_path):
    def run_id(sets: list[str]) -> str:
        runner = SuiteRunner(load_suite(str(tiny_suite_file), sets), tmp_path / "results",
                             tmp_path / "cache", log=lambda _: None)
        return runner.planner.run_id("kd", "rte", 1)

    assert run_id(["title=Another title"]) == run_id([])
