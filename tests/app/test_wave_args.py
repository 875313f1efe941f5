"""``pdrig wave``'s numbers and URLs are range-checked before any folder or request: rc 2, one
line naming the flag, nothing written."""

from __future__ import annotations

import pytest

from tests.helpers.hostile import in_fresh_dir, refused

URLS = ["--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200"]


@pytest.mark.parametrize("extra, flag", [
    (["--block-size", "-1"], "--block-size"), (["--prefill-blocks", "0"], "--prefill-blocks"),
    (["--decode-blocks", "-3"], "--decode-blocks"), (["--drain", "nan"], "--drain"), (["--drain", "inf"], "--drain"),
    (["--drain", "-1"], "--drain"), (["--seed", "-1"], "--seed")])
def test_a_wave_number_out_of_range_is_refused_naming_its_flag(extra, flag):
    with in_fresh_dir() as d:
        line = refused(["wave", "pressure", *URLS, *extra], d, set())
    assert line.startswith(f"pdrig: {flag} ")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:0"])
def test_a_wave_url_whose_port_is_not_a_tcp_port_is_refused(url):
    with in_fresh_dir() as d:
        line = refused(["wave", "pressure", "--prefill", url, "--decode", "http://127.0.0.1:8200"], d, set())
    assert "--prefill" in line and "1-65535" in line
