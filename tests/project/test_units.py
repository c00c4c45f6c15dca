import pytest

from autosp.errors import UsageError
from autosp.units import format_tokens, parse_count, parse_ctx


@pytest.mark.parametrize("text,value", [
    ("131072", 131_072), ("200_000", 200_000), ("200k", 200_000), ("200K", 200_000), ("1.5m", 1_500_000),
    ("3.7M", 3_700_000), ("128Ki", 131_072), ("128ki", 131_072), ("1Mi", 1_048_576), ("  64k ", 64_000),
    ("0.5k", 500), (".5k", 500), (4096, 4096),
])
def test_parse_ctx_accepts_the_documented_grammar(text, value):
    assert parse_ctx(text) == value


@pytest.mark.parametrize("text", ["", "0", "0k", "-5", "-1k", "abc", "1e5", "2g", "200kk", "1__000", "_1", "1_",
                                  "1.0005k", "1.5", "k", "12 34", str(2**41), True, 1.5, None])
def test_parse_ctx_rejects_with_one_line(text):
    with pytest.raises(UsageError) as err:
        parse_ctx(text)
    message = str(err.value)
    assert "\n" not in message and message.startswith("--ctx")


def test_parse_count_has_no_suffixes():
    assert parse_count("1_024", "--trials") == 1024
    with pytest.raises(UsageError, match="--nodes"):
        parse_count("4k", "--nodes")
    with pytest.raises(UsageError, match="positive"):
        parse_count("0", "--global-batch")


@pytest.mark.parametrize("n,text", [(200_000, "200k"), (3_700_000, "3.7M"), (131_072, "128Ki"),
                                    (1_048_576, "1Mi"), (500, "500"), (15_000_000, "15M"),
                                    (604_160, "604.2k"), (3_821_568, "3.82M"), (1024, "1Ki"), (2**25, "32Mi")])
def test_format_tokens(n, text):
    assert format_tokens(n) == text


def test_durations():
    from autosp.units import parse_seconds

    assert parse_seconds("30", "--time-budget") == 30.0
    assert parse_seconds("90s", "--time-budget") == 90.0
    assert parse_seconds("2m", "--time-budget") == 120.0
    assert parse_seconds(" 1.5h ", "--time-budget") == 5400.0
    assert parse_seconds(2, "--time-budget") == 2.0
    for bad in ("0", "-1", "soon", "2 days", "", True, float("inf")):
        with pytest.raises(UsageError, match="--time-budget"):
            parse_seconds(bad, "--time-budget")
