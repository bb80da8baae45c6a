"""The flag table (components/core/flags.py): what it writes, what it refuses, what it documents.

A case a file under tests/data/flags/: the settings that set a flag and the unit they render
(a golden file next to it), and the refusals the flag brings. Regenerate the golden units and
docs/flags.md deliberately with UPDATE_GOLDEN=1.
"""
import sys
from pathlib import Path

import pytest

from components.core import flags
from components.core.config import OPTIONAL_SECTIONS, SECTIONS, parse_settings
from components.core.errors import ConfigError
from components.core.plan import build_plan
from components.core.strategy import OWNED_FLAGS

from .casedata import DATA, case_config, cases, update_golden

ROOT = Path(__file__).resolve().parent.parent
FLAG_CASES = DATA / "flags"
DOC = ROOT / "docs" / "flags.md"


def _golden(path: Path, text: str):
    if update_golden():
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{path} differs (review, then UPDATE_GOLDEN=1)"


@pytest.mark.parametrize("name,case", cases("flags"), ids=lambda x: x if isinstance(x, str) else "")
def test_flag_case_renders_its_golden_unit(name, case):
    plan = build_plan(parse_settings("tp8", case_config(case)))
    _golden(FLAG_CASES / case["unit"], plan.unit.text)


@pytest.mark.parametrize("name,case", cases("flags"), ids=lambda x: x if isinstance(x, str) else "")
def test_flag_case_refusals_name_the_setting(name, case):
    assert case["refused"], "a flag case lists the refusals its flag brings"
    for refusal in case["refused"]:
        with pytest.raises(ConfigError) as info:
            build_plan(parse_settings("tp8", case_config(refusal)))
        named = [e for e in info.value.errors if e.setting == refusal["setting"]]
        assert named, f"no error names {refusal['setting']}: {info.value}"
        assert any(refusal["contains"] in str(e) for e in named), str(info.value)


def test_every_flag_of_the_table_is_written_by_a_golden_unit():
    # The shipped stacks' units and the flag cases' together: a row without a case fails here.
    text = "".join(p.read_text() for folder in ("units", "flags", "pd") for p in (DATA / folder).glob("*.service"))
    missing = [row.flag for row in flags.FLAGS if row.form != flags.REFUSED and f"    {row.flag}" not in text]
    assert not missing, f"no golden unit writes {missing}: add a case under tests/data/flags/"


def test_every_row_names_a_real_setting():
    for row in flags.FLAGS:
        if row.form == flags.REFUSED:
            assert row.setting is None
            continue
        fields = {**SECTIONS, **OPTIONAL_SECTIONS}[row.section].model_fields
        assert row.attribute in fields, row
        assert (fields[row.attribute].alias or row.attribute) == row.key, row


def test_the_table_declares_its_serving_settings_in_order():
    fields = list(SECTIONS["serving"].model_fields)
    declared = list(flags.declared("serving"))
    assert declared == fields[2:2 + len(declared)], "port, host, then the table's settings in its order"
    assert "cuda_graph_max_bs" in declared and parse_settings("tp8", case_config({"config": {}})).serving.cuda_graph_max_bs is None


def test_owned_flags_are_every_spelling_of_the_table():
    assert set(OWNED_FLAGS) == {s for row in flags.FLAGS for s in row.spellings}
    assert OWNED_FLAGS["--cuda-graph-max-bs"] == OWNED_FLAGS["--cuda-graph-max-bs-decode"] == "serving.cudaGraphMaxBs"
    assert OWNED_FLAGS["--tp"] == "strategy.tpSize" and OWNED_FLAGS["--nnodes"] == "strategy.nodes"


def test_every_spelling_is_one_sglangs_parser_accepts():
    # The rehearsal engine's parser follows SGLang's server_args.py (its spellings, its aliases).
    sys.path.insert(0, str(ROOT / "rehearsal" / "engine"))
    try:
        from sglang._rehearsal.args import build_parser
    finally:
        sys.path.remove(str(ROOT / "rehearsal" / "engine"))
    known = {s for action in build_parser()._actions for s in action.option_strings}
    # --tp, --dp: argparse's prefix abbreviations of --tp-size/--dp-size (SGLang has no such flag).
    abbreviations = {"--tp", "--dp"}
    unknown = [s for row in flags.FLAGS for s in row.spellings if s not in known and s not in abbreviations]
    assert not unknown, unknown


def test_the_flag_page_is_generated_from_the_table():
    _golden(DOC, flags.markdown(SECTIONS))
    assert "`--cuda-graph-max-bs-decode` | `serving.cudaGraphMaxBs`" in DOC.read_text()
