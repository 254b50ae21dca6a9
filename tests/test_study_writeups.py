"""Tests for the studies' write-ups: bench/studies/*/results.md and the README's study paragraphs.

What "correct" means for a write-up:
- it never reads "no change" into a test that cannot show one: phrases such as "does not move",
  "costs nothing", "as good" or "no difference" do not occur (a difference within the stated margin
  is called "equivalent within ±0.02", and only where the equivalence test says so);
- every number it prints with a decimal point is one that results.json holds, at the precision it
  is printed with (a sign may be dropped, as in "falls 0.15 below"). The numbers searched are every
  number in the study's results.json files (per-query values, STS cosines, PCA coordinates and loss
  curves left out, since among thousands of them any number would be found), plus the mean over a
  model's seeds of its first and last loss, which the tables print. Timings ("9.0 min", "8.8
  minutes") are measured, not derived from results.json, and are not searched, nor are section
  numbers ("section 2.4") and the bound in "p < 0.001".
"""

import json
import re
from pathlib import Path

import pytest

from .conftest import REPO

STUDIES = REPO / "bench" / "studies"
WRITEUPS = sorted(STUDIES.rglob("results.md"))
# Claims of "no change" that a p above 0.05 cannot carry (issue: equivalence needs its own test).
UNSUPPORTED = [r"\bno change", r"\bdo(?:es)? not move", r"\bstays? where", r"\bwhere (?:it|they) (?:started|began)",
               r"\bcosts? nothing", r"\bas good\b", r"\bno (?:detectable )?difference", r"\bleaves? \w+ alone",
               r"\b(?:is|are|was|were|stays?|remains?) the same\b", r"\bthe same (?:score|NDCG|quality|result)"]
NUMBER = re.compile(r"(?<![\w.])[-+−]?(\d+\.\d+)(?!\.?\d)(?!\s*(?:min\b|minutes\b))")
LEFT_OUT = {"per_query", "sts_cosine", "pca", "loss", "seconds"}


def readme_study_paragraphs() -> str:
    """The README's section on the studies, from its heading to the next one."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## The papers' studies")
    return text[start:text.index("\n## ", start + 1)]


def stored_numbers(folder: Path, pattern: str = "results.json") -> list:
    """Every number of the folder's results.json (pattern "**/results.json": of every one under it),
    less LEFT_OUT, with each model's mean first and last loss over its seeds."""
    found = []

    def walk(value, key=None):
        if key in LEFT_OUT:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append(float(value))

    for path in folder.glob(pattern):
        results = json.loads(path.read_text(encoding="utf-8"))
        walk(results)
        for model in results.get("models", {}).values():
            losses = [run["training"]["loss"] for run in model.get("runs", []) if "training" in run]
            if losses:
                found += [sum(loss[0] for loss in losses) / len(losses), sum(loss[-1] for loss in losses) / len(losses)]
    return found


def unsourced(text: str, numbers: list) -> list:
    """The numbers printed in text (with a decimal point) that no stored number rounds to."""
    missing = []
    for match in NUMBER.finditer(text):
        if re.search(r"(?:sections? (?:[\d.]+, )*|p <=? )$", text[max(0, match.start() - 30):match.start()]):
            continue  # a section number, or the bound of a p too small to print
        printed = match.group(1)
        value, places = float(printed), len(printed.split(".")[1])
        if not any(abs(abs(number) - value) <= 0.5 * 10**-places + 1e-12 for number in numbers):
            missing.append(text[max(0, match.start() - 40):match.end() + 10].replace("\n", " "))
    return missing


def test_there_are_write_ups_to_check():
    assert {path.parent.name for path in WRITEUPS} >= {"siamese-vs-triplet", "embedding-size", "sbert-objectives",
                                                       "model-selection"}


@pytest.mark.parametrize("path", WRITEUPS + [REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_no_sentence_claims_no_change_without_an_equivalence_test(path):
    text = readme_study_paragraphs() if path.name == "README.md" else path.read_text(encoding="utf-8")
    found = [m.group(0) for pattern in UNSUPPORTED for m in re.finditer(pattern, text, re.IGNORECASE)]
    assert not found, f"{path}: {found}"


@pytest.mark.parametrize("path", WRITEUPS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_number_of_a_results_md_is_in_its_results_json(path):
    assert unsourced(path.read_text(encoding="utf-8"), stored_numbers(path.parent)) == []


def test_every_number_of_the_readmes_study_paragraphs_is_in_a_results_json():
    # A paragraph that links a study's results.md is checked against that study's folder alone, so
    # that a number typed wrong cannot be found by chance in another study; the others against all.
    for paragraph in readme_study_paragraphs().split("\n\n"):
        link = re.search(r"\(bench/studies/([\w-]+)/results\.md\)", paragraph)
        folder = STUDIES / link.group(1) if link else STUDIES
        assert unsourced(paragraph, stored_numbers(folder, "**/results.json")) == [], paragraph[:60]


def test_the_checks_catch_a_number_typed_by_hand_and_a_claim_of_no_change():
    numbers = [0.06349, -0.02751, 0.5]
    assert unsourced("+0.063 and -0.028 and 0.50, 9.0 min, torch 2.13.0, section 2.4, p < 0.001", numbers) == []
    assert len(unsourced("[+0.009, +0.064]", numbers)) == 2  # 0.064 is not 0.06349 rounded
    assert any(re.search(p, "Siamese cosine does not move", re.IGNORECASE) for p in UNSUPPORTED)
