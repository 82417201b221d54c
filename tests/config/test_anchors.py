"""The published numbers (suites/anchors/published.csv) and their loader."""

from __future__ import annotations

import shutil

import pytest

from harness.config.published import PUBLISHED, AnchorError, ablation_columns, load_published
from harness.config.schema import available_suites
from harness.experiments.suites import load_suite


def test_published_file_loads_and_names_methods_the_suites_declare():
    published = load_published()
    assert len(published) > 200
    declared = {"teacher"}
    for name in available_suites():
        declared |= set(load_suite(name).method_names())
    assert set(published["method"]) <= declared
    assert set(published["split"]) == {"dev", "test", "-"}
    # efficiency rows carry no split; score rows always one
    efficiency = published[published["task"] == "-"]
    assert (efficiency["split"] == "-").all() and (published.loc[published["task"] != "-",
                                                                 "split"] != "-").all()
    tinybert = published[(published["source_label"] == "TinyBERT4")
                         & (published["table"].str.startswith("Table 1"))]
    assert tinybert.set_index("metric").loc["parameters_millions", "value"] == 14.5
    assert tinybert[tinybert["task"] == "sst2"]["split"].item() == "test"
    # transcriptions from memory stay marked
    assert not published[published["method"] == "bilstm-soft"]["verified"].any()


def _copy(tmp_path, edit):
    path = tmp_path / "published.csv"
    shutil.copy(PUBLISHED, path)
    lines = path.read_text().splitlines()
    edit(lines)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda lines: lines.__setitem__(4, lines[4].replace(",test,", ",valid,")),
     ":5: split must be dev or test"),
    (lambda lines: lines.__setitem__(4, lines[4].replace(",83.9,", ",eighty,")),
     ":5: value 'eighty' is not a number"),
    (lambda lines: lines.__setitem__(5, lines[5].replace(",accuracy,", ",acc,")),
     ":6: metric 'acc'"),
    (lambda lines: lines.__setitem__(0, lines[0].replace("verified", "checked")),
     ":1: the header must be"),
    (lambda lines: lines.append(lines[5]), "listed twice"),
    (lambda lines: lines.__setitem__(7, lines[7].replace(",true,", ",yes,")),
     ":8: verified must be true or false"),
])
def test_malformed_anchor_files_name_file_and_line(tmp_path, edit, message):
    path = _copy(tmp_path, edit)
    with pytest.raises(AnchorError, match=message) as caught:
        load_published(path)
    assert str(path) in str(caught.value)


def test_ablation_columns_put_the_papers_rows_beside_the_variants():
    wide = ablation_columns(load_published(), ["procedure", "mapping"])
    assert wide.loc["tinybert-no-gd", "paper_cola"] == 40.8
    assert wide.loc["tinybert-bottom", "paper_average"] == 71.3
    assert wide.loc["tinybert", "paper_average"] == 75.6  # in every table, listed once
    assert "tinybert-no-attn" not in wide.index  # objective table not asked for
    assert list(wide.columns[:2]) == ["paper_mnli_m", "paper_mnli_mm"]
