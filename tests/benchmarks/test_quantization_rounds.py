"""The quantization benchmark's rounds: each scheme's median over alternating processes."""

from __future__ import annotations

import pytest

from folio.benchmarks.quantization import main, merge_rounds, print_table


def test_rounds_merge_into_medians_and_the_ratio_is_of_medians(capsys):
    rounds = [
        [{"scheme": "baseline", "ms_per_token": 5.6, "blocks": 10}, {"scheme": "int4-rtn", "ms_per_token": 2.6, "blocks": 30}],
        [{"scheme": "baseline", "ms_per_token": 5.7, "blocks": 10}, {"scheme": "int4-rtn", "ms_per_token": 2.4, "blocks": 30}],
        [{"scheme": "baseline", "ms_per_token": 5.5, "blocks": 10}, {"scheme": "int4-rtn", "ms_per_token": 2.5, "blocks": 30}],
    ]
    merged = merge_rounds("decode", rounds)
    assert [m["scheme"] for m in merged] == ["baseline", "int4-rtn"]
    assert merged[0]["ms_per_token"] == 5.6 and merged[1]["ms_per_token"] == 2.5
    assert merged[1]["runs"] == [2.6, 2.4, 2.5] and merged[1]["blocks"] == 30
    print_table("decode", merged)
    out = capsys.readouterr().out
    assert "| scheme | median of 3 | vs baseline | runs |" in out
    assert "| int4-rtn | 2.5 | 0.446x | 2.6, 2.4, 2.5 |" in out


def test_one_round_prints_the_plain_table(capsys):
    print_table("decode", merge_rounds("decode", [[{"scheme": "baseline", "ms_per_token": 5.6}]]))
    out = capsys.readouterr().out
    assert "| scheme | ms_per_token | vs baseline |" in out and "| baseline | 5.6 | 1.000x |" in out


def test_rounds_below_one_are_refused():
    with pytest.raises(SystemExit):
        main(["decode", "--rounds", "0"])
