"""Parsing and printing the numbers people type and read: context lengths, counts, bytes.

Context-length grammar (``--ctx``), case-insensitive, surrounding blanks ignored:

- a plain integer, with optional ``_`` digit separators: ``131072``, ``200_000``;
- a number with a **decimal** suffix ``k`` (10^3) or ``m`` (10^6): ``200k`` = 200,000,
  ``1.5m`` = 1,500,000, ``3.7M`` = 3,700,000;
- a number with a **binary** suffix ``ki`` (2^10) or ``mi`` (2^20): ``128Ki`` = 131,072,
  ``1Mi`` = 1,048,576.

A fraction is allowed only when the result is a whole number of tokens (``1.5k`` yes, ``1.0005k`` no).
Zero, negative, malformed or absurdly large values raise :class:`~autosp.errors.UsageError` with one
line that repeats the grammar.
"""

from __future__ import annotations

import re
from fractions import Fraction

from autosp.errors import UsageError

SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "ki": 2**10, "mi": 2**20}
MAX_TOKENS = 2**40
CTX_GRAMMAR = ("an integer with an optional suffix: k = 1,000, m = 1,000,000 (decimal); "
               "Ki = 1,024, Mi = 1,048,576 (binary); e.g. 200k, 1.5M, 128Ki, 131_072")

_NUMBER = re.compile(r"^([+-]?)(\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)\s*([a-z]*)$")


def _parse_scaled(text: str, what: str, allow_suffix: bool) -> int:
    if not isinstance(text, str):
        if isinstance(text, bool) or not isinstance(text, int):
            raise UsageError(f"{what} must be an integer, got {text!r}")
        value = text
    else:
        raw = text.strip().lower()
        match = _NUMBER.match(raw)
        grammar = CTX_GRAMMAR if allow_suffix else "a positive integer, e.g. 8"
        if not match or "__" in raw or match.group(2).endswith("_") or "_." in raw or "._" in raw:
            raise UsageError(f"{what}: cannot read {text!r}; expected {grammar}")
        sign, digits, suffix = match.groups()
        if suffix not in SUFFIXES or (suffix and not allow_suffix):
            raise UsageError(f"{what}: unknown suffix {suffix!r} in {text!r}; expected {grammar}")
        number = Fraction(digits.replace("_", "")) * SUFFIXES[suffix]
        if sign == "-":
            number = -number
        if number.denominator != 1:
            raise UsageError(f"{what}: {text!r} is not a whole number ({float(number):,.3f})")
        value = int(number)
    if value <= 0:
        raise UsageError(f"{what} must be positive, got {text!r}")
    if value > MAX_TOKENS:
        raise UsageError(f"{what}: {text!r} is larger than the supported maximum {MAX_TOKENS:,}")
    return value


def parse_ctx(text) -> int:
    """``"200k"`` -> 200000, ``"128Ki"`` -> 131072; see the module docstring for the grammar."""
    return _parse_scaled(text, "--ctx", allow_suffix=True)


def parse_count(text, what: str, most: int | None = None, hint: str = "") -> int:
    """A positive integer such as ``--nodes 4`` or ``--global-batch 64`` (``_`` separators allowed), at most
    ``most`` when given (``hint`` then says what to do instead)."""
    value = _parse_scaled(text, what, allow_suffix=False)
    if most is not None and value > most:
        raise UsageError(f"{what} {value:,} is more than autosp runs ({most:,}){'; ' + hint if hint else ''}")
    return value


SEED_RANGE = (0, 2**32 - 1)
"""numpy's (and so Optuna's) seed range."""


def check_seed(seed, what: str = "--seed") -> int:
    """An integer seed in :data:`SEED_RANGE`."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"{what} must be an integer, got {seed!r}")
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise UsageError(f"{what} must be between {SEED_RANGE[0]} and {SEED_RANGE[1]:,} (2**32 - 1), got {seed}")
    return seed


_DURATION = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(s|m|min|h)?$")
_DURATION_UNITS = {None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}


def parse_seconds(text, what: str) -> float:
    """A positive duration such as ``--time-budget 30`` (seconds), ``90s``, ``2m`` or ``1.5h``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    elif isinstance(text, str) and _DURATION.match(text.strip().lower()):
        number, unit = _DURATION.match(text.strip().lower()).groups()
        value = float(number) * _DURATION_UNITS[unit]
    else:
        raise UsageError(f"{what}: cannot read {text!r}; expected seconds, e.g. 30, 90s, 2m or 1h")
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{what} must be a positive duration, got {text!r}")
    return value


def format_tokens(n: int) -> str:
    """A short human form: 200000 -> '200k', 3_700_000 -> '3.7M', 131072 -> '128Ki', 1000 -> '1k'.

    Binary suffixes only for powers of two (the lengths people type as 128Ki or 1Mi); everything else
    is decimal, rounded (3_821_568 -> '3.82M', 604_160 -> '604.2k')."""
    n = int(n)
    for unit, suffix in ((2**20, "Mi"), (2**10, "Ki")):
        mantissa = n // unit
        if n % unit == 0 and mantissa & (mantissa - 1) == 0 and n % 1000 != 0:
            return f"{mantissa}{suffix}"
    if n >= 10**6:
        text = f"{n / 10**6:.2f}".rstrip("0").rstrip(".")
        return f"{text}M"
    if n >= 10**3:
        text = f"{n / 10**3:.1f}".rstrip("0").rstrip(".")
        return f"{text}k"
    return str(n)


GIB = float(2**30)


def format_gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f} GiB"


def format_seconds(seconds: float) -> str:
    if seconds >= 100:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


__all__ = ["CTX_GRAMMAR", "GIB", "MAX_TOKENS", "SUFFIXES", "format_gib", "format_seconds", "format_tokens",
           "SEED_RANGE", "check_seed", "parse_count", "parse_ctx", "parse_seconds"]
