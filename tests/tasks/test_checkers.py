"""The data task's checkers on hand-worked cases: what each reads as right, and near-misses that must score 0."""

from __future__ import annotations

import pytest

from reflectrl.errors import ConfigError
from reflectrl.tasks.checkers import Checker, choice_letter, extract, format_demonstration, parse_number

# (completion, reference, score): worked by hand from the rules of docs/tasks.md ("Checkers")
NUMBER = [
    ("42", "42", 1), ("42.0", "42", 1), (" 42\n", "42", 1), ("1,000", "1000", 1), ("1e3", "1000", 1),
    ("1E3", "1,000", 1), ("$5", "5", 1), ("\\$5", "5", 1), ("5.0", "5", 1), ("5.", "5", 1), ("#### 42", "42", 1),
    ("\\boxed{42}", "42", 1), ("The answer is 42.", "42", 1), ("She pays $1,250 in total.", "1250", 1),
    ("-3", "-3", 1), ("\u22123", "-3", 1), ("50%", "50", 1), ("3/4", "0.75", 1), ("\\frac{3}{4}", "0.75", 1),
    ("0.75", "3/4", 1), ("1.5e-3", "0.0015", 1), ("5 dollars", "5", 1), ("x = 7", "7", 1),
    ("<answer>12</answer>", "12", 1), ("42 <confidence>0.9</confidence>", "42", 1), ("Step 1: 3+4=7\n#### 7", "7", 1),
    ("+8", "8", 1), ("It costs 3 + 4 = 7 dollars", "Ana pays 3 + 4 = 7.\n#### 7", 1), ("0.1 + 0.2 = 0.30000000000000004",
                                                                                    "0.3", 1),
    # near-misses
    ("43", "42", 0), ("42.5", "42", 0), ("420", "42", 0), ("4.2", "42", 0), ("1,00", "100", 0), ("-42", "42", 0),
    ("", "42", 0), ("forty-two", "42", 0), ("42 or 43", "42", 0), ("1e-3", "1000", 0), ("4 2", "42", 0),
    ("3/5", "0.75", 0), ("\\boxed{41}", "42", 0), ("#### 41\n", "42", 0), ("42.0001", "42", 0),
    ("1,000.5", "1000", 0), ("0.33", "1/3", 0), ("12/0", "12", 0), ("#### 42\n#### 43", "42", 0),
    ("<answer>7</answer> 42", "42", 0),
]

MATH = [
    ("\\frac{1}{2}", "0.5", 1), ("0.5", "\\frac{1}{2}", 1), ("\\boxed{\\frac{1}{2}}", "1/2", 1),
    ("$\\frac{\\sqrt{2}}{2}$", "\\frac{1}{\\sqrt{2}}", 1), ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", 1),
    ("x^2+2x+1", "(x+1)^2", 1), ("2x+2", "2(x+1)", 1), ("\\pi/2", "\\frac{\\pi}{2}", 1), ("90^\\circ", "90", 1),
    ("\\{1,2\\}", "\\{2,1\\}", 1), ("(1, 2)", "(1,2)", 1), ("[0, 1)", "[0,1)", 1), ("2\\sqrt{3}", "\\sqrt{12}", 1),
    ("x=5", "5", 1), ("The answer is $\\boxed{7}$.", "7", 1), ("<answer>3/4</answer>", "0.75", 1),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", 1), ("10^3", "1000", 1), ("-\\frac{1}{3}", "-1/3", 1),
    ("\\frac{6}{8}", "\\frac{3}{4}", 1), ("\\log_2 8", "3", 1), ("\\sin^2 x + \\cos^2 x", "1", 1),
    ("3 + 4i", "4i+3", 1), ("\\infty", "\\infty", 1), ("x \\in [1,2]", "[1,2]", 1),
    ("Half of it: \\boxed{\\frac{1}{2}} <confidence>0.7</confidence>", "\\frac{1}{2}", 1),
    # near-misses
    ("\\frac{1}{3}", "0.333", 0), ("\\frac{1}{2}", "\\frac{1}{3}", 0), ("x^2", "x^3", 0), ("2x+1", "2x-1", 0),
    ("\\sqrt{2}", "\\sqrt{3}", 0), ("(1,2)", "(2,1)", 0), ("[0,1]", "[0,1)", 0), ("\\{1,2\\}", "\\{1,2,3\\}", 0),
    ("-7", "7", 0), ("x=6", "5", 0), ("\\pi", "3", 0), ("", "5", 0), ("no idea", "5", 0), ("12", "21", 0),
    ("\\boxed{8}", "\\frac{1}{8}", 0), ("5", "x+5", 0), ("y+1", "x+1", 0), ("0.5001", "1/2", 0),
    ("\\frac{\\pi}{3}", "\\frac{\\pi}{6}", 0), ("\\boxed{3} and then \\boxed{4}", "3", 0),
]


@pytest.mark.parametrize("completion, reference, want", NUMBER, ids=[repr(c[0])[:30] for c in NUMBER])
def test_number(completion, reference, want):
    assert Checker("number").score(completion, reference) == want


def test_number_tolerance():
    assert Checker("number", tolerance=1e-3).score("42.0001", "42") == 1
    assert Checker("number", tolerance=1e-3).score("42.1", "42") == 0
    assert Checker("number", tolerance=0).score("0.30000000000000004", "0.3") == 0  # decimals are read exactly
    assert Checker("number").score("0.0000001", "0") == 1  # |x - y| <= tolerance * max(1, |y|)


@pytest.mark.parametrize("completion, reference, want", MATH, ids=[repr(c[0])[:30] for c in MATH])
def test_math(completion, reference, want):
    pytest.importorskip("math_verify")
    assert Checker("math").score(completion, reference) == want


def test_there_are_forty_hand_worked_cases_of_each_with_near_misses():
    for cases in (NUMBER, MATH):
        assert len(cases) >= 40 and sum(c[2] == 0 for c in cases) >= 15


@pytest.mark.parametrize("completion, want", [
    ("<answer> Paris </answer>", "Paris"), ("so \\boxed{\\frac{1}{2}} or \\boxed{x^{2}}", "x^{2}"),
    ("work\n#### 17\nmore", "17"), ("plain text", "plain text"), ("a <answer>B", "B"),
    ("7 <confidence>0.4</confidence>", "7"), (None, None),
])
def test_auto_extraction(completion, want):
    assert extract(completion, "auto") == want


def test_extraction_modes_need_their_form():
    text = "reasoning\n\\boxed{3}\n#### 4\n<answer>5</answer>\nlast"
    assert [extract(text, m) for m in ("answer-tag", "boxed", "hash", "last-line", "first-line")] == \
        ["5", "3", "4", "last", "reasoning"]
    assert extract("just 4", "boxed") is None and extract("just 4", "hash") is None
    assert Checker("number", extract="boxed").score("4", "4") == 0  # a strict form is required
    assert Checker("number", extract="last-line").score("I think 3\n4", "4") == 1
    assert format_demonstration("4", "boxed") == "\\boxed{4}" and format_demonstration("#### 4", "hash") == "#### 4"


def test_exact_and_regex():
    assert Checker("exact").score(" Paris\n", "Paris") == 1
    assert Checker("exact").score("paris", "Paris") == 0
    assert Checker("exact", ignore_case=True).score("PARIS", "paris") == 1
    assert Checker("exact").score("Paris.", "Paris") == 0
    assert Checker("exact").score("#### 72", "Ana has 72.\n#### 72") == 1  # the reference is read with auto too
    regex = Checker("regex")
    assert regex.score("four", "4|four") == 1 and regex.score("fourteen", "4|four") == 0
    assert Checker("regex", ignore_case=True).score("FOUR", "4|four") == 1
    assert regex.reference_error("(unclosed") is not None


@pytest.mark.parametrize("completion, want", [
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("b", "B"), ("B) Paris", "B"), ("(C) Rome", "C"),
    ("The answer is C.", "C"), ("Answer: (D)", "D"), ("Paris", "B"), ("paris.", "B"),
    ("A or B", None), ("AB", None), ("Bonn", None), ("", None),
])
def test_choice_letters(completion, want):
    assert choice_letter(completion, ["Rome", "Paris", "Oslo", "Bern"]) == want


def test_choice_checker_and_references():
    c = Checker("choice")
    meta = {"choices": ["Rome", "Paris", "Oslo"]}
    assert c.score("B", "B", meta) == 1 and c.score("The answer is B", "Paris", meta) == 1
    assert c.score("B", "1", meta) == 1  # a 0-based index reads as its letter
    assert c.score("C", "B", meta) == 0 and c.score("A or B", "B", meta) == 0
    assert "option letter (A-C)" in c.reference_error("D", meta["choices"])


def test_parse_number_reads_one_number():
    assert parse_number("1,234,567.5") == parse_number("1234567.5")
    assert parse_number("about 5 or 6", whole_only=True) is None and parse_number("about 5 or 6") == 6


def test_unknown_checker_and_extract():
    with pytest.raises(ConfigError, match="unknown checker 'nope'; choose one of exact, number"):
        Checker("nope")
    with pytest.raises(ConfigError, match="unknown extract 'tail'"):
        Checker("exact", extract="tail")


JUNK = ["9" * 1_000_000, "1," * 300_000, "\\boxed{" * 50_000, "<answer>" * 100_000, "\x00\udcff" * 1000, "$" * 100_000,
        "\\frac{" * 20_000, "((((" * 5000 + "x", "1e99999999", "9" * 60 + "/" + "0" * 60, "x^" * 3000 + "2",
        "#### " * 50_000, None, 42, ["42"]]


@pytest.mark.parametrize("name", ["exact", "number", "math", "choice", "regex"])
def test_junk_scores_0_quickly(name):
    import time

    if name == "math":
        pytest.importorskip("math_verify")
    checker = Checker(name)
    start = time.monotonic()
    assert [checker.score(j, "42") for j in JUNK] == [0.0] * len(JUNK)
    assert time.monotonic() - start < 30  # seconds: each is cut short (cf. quadratic scans, huge exponents, sympy)
