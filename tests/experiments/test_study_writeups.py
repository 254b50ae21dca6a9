"""Tests for the studies' write-ups: bench/studies/*/results.md and the README's study paragraphs.

What "correct" means for a write-up:
- it is exactly what the code makes of the stored results: each study's results.md is rebuilt by its
  report function from its results.json (settings, models, tests) and compared byte for byte, so every
  printed number is the one its own key holds, and every verdict the one its test gives; swapping two
  models' values, or using another network's p, fails;
- the README's study section after the commands is exactly `python -m minisbert.experiments summary`
  (minisbert/experiments/summary.py), built from the same results.json files;
- it never reads "no change" into a test that cannot show one: phrases such as "does not move",
  "costs nothing", "as good" or "no difference" do not occur;
- every verdict follows from the one inference stored beside it (the crossed t): its word
  from its Holm-adjusted p's, which are Holm's adjustment of the family's stored p's; every printed
  equivalence bound lies below the margin exactly where the verdict says "equivalent"; and (slow) the
  stored tests are what the study's own code computes again from the per-seed, per-query records.
"""

import argparse
import json
import re

import numpy as np
import pytest

from minisbert import datasets
from minisbert.evaluation import significance
from minisbert.experiments import (compare_runs, embedding_size, embedding_size_report, model_selection, runner,
                                   sbert_objectives, siamese_vs_triplet, siamese_vs_triplet_report, summary, verdicts)

from ..conftest import REPO

STUDIES = REPO / "bench" / "studies"
WRITEUPS = sorted(STUDIES.rglob("results.md"))
# Claims of "no change" that a p above 0.05 cannot carry (issue: equivalence needs its own test).
UNSUPPORTED = [r"\bno change", r"\bdo(?:es)? not move", r"\bstays? where", r"\bwhere (?:it|they) (?:started|began)",
               r"\bcosts? nothing", r"\bas good\b", r"\bno (?:detectable )?difference", r"\bleaves? \w+ alone",
               r"\b(?:is|are|was|were|stays?|remains?) the same\b", r"\bthe same (?:score|NDCG|quality|result)"]


def readme_study_section() -> str:
    """The README's section on the studies, from its heading to the next one."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("## The papers' studies")
    return text[start:text.index("\n## ", start + 1) + 1]


class Sizes:
    """What a report reads of the test data: its number of queries and documents."""

    def __init__(self, queries: int, documents: int):
        self.queries, self.corpus = range(queries), range(documents)


def rebuilt(folder) -> str:
    """The results.md that the study's report makes of the folder's results.json, settings.json and
    run.json alone (the test data's sizes are read from results.md's own line: they are not numbers
    results.json holds)."""
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    written = (folder / "results.md").read_text(encoding="utf-8")
    if "names" in results:  # compare-runs
        first, second = (json.loads((REPO / results[key] / "results.json").read_text()) for key in ("first", "second"))
        args = argparse.Namespace(first=REPO / results["first"], second=REPO / results["second"], names=results["names"],
                                  metric=results["metric"])
        args.first, args.second = (type(args.first)(results[key]) for key in ("first", "second"))
        pairs = [tuple(pair.split(":")) for pair in results["tests"]]
        return compare_runs.report(args, first, second, pairs, list(results["tests"].values()))
    settings = argparse.Namespace(**results["settings"])
    study = runner.Study.__new__(runner.Study)
    study.output = folder
    about, run, margin = study.about(), study.run(), study.margin_record()
    sizes = re.search(r"([\d,]+) (?:test )?queries over ([\d,]+) documents", written)
    queries, documents = (int(group.replace(",", "")) for group in sizes.groups())
    experiment = json.loads((folder / "settings.json").read_text())["experiment"]
    models, tests = results["models"], results["tests"]
    if experiment == "siamese-vs-triplet":
        trained = siamese_vs_triplet.networks(settings.margins)
        return siamese_vs_triplet_report.report(settings, trained, about, models, tests, queries, documents, run, margin)
    if experiment == "embedding-size":
        return embedding_size_report.report(settings, about, models, tests, results["search_speed"], documents, False, run,
                                     margin)
    if experiment == "sbert-objectives":
        pairs = int(re.search(r"STS-B test: ([\d,]+) pairs", written).group(1).replace(",", ""))
        return sbert_objectives.report(settings, about, models, tests, pairs, Sizes(queries, documents), run, margin)
    keys = [f"{key}@{k}" for _, key in model_selection.COLUMNS for k in settings.k]
    return model_selection.report(settings, about, models, tests, results["best"], keys, Sizes(queries, documents),
                                  margin)


def differences(written: str, expected: str) -> list:
    """The lines of a write-up that are not the ones the code makes of its results."""
    return [line for line, want in zip(written.splitlines(), expected.splitlines()) if line != want] + (
        ["(a different number of lines)"] if len(written.splitlines()) != len(expected.splitlines()) else [])


def test_there_are_write_ups_to_check():
    assert {path.parent.name for path in WRITEUPS} >= {"siamese-vs-triplet", "embedding-size", "sbert-objectives",
                                                       "model-selection", "epochs-3", "epochs-3-against-2", "margins"}


@pytest.mark.parametrize("path", WRITEUPS + [REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_no_sentence_claims_no_change_without_an_equivalence_test(path):
    text = readme_study_section() if path.name == "README.md" else path.read_text(encoding="utf-8")
    found = [m.group(0) for pattern in UNSUPPORTED for m in re.finditer(pattern, text, re.IGNORECASE)]
    assert not found, f"{path}: {found}"


@pytest.mark.parametrize("path", WRITEUPS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_results_md_is_what_its_results_json_makes(path, monkeypatch):
    monkeypatch.chdir(REPO)  # compare-runs names its folders relative to the repository
    written = path.read_text(encoding="utf-8")
    assert differences(written, rebuilt(path.parent)) == []


def test_the_readmes_study_section_is_what_the_results_make():
    assert readme_study_section().rstrip("\n").endswith(summary.section().rstrip("\n"))


def test_the_check_catches_another_networks_number_a_moved_cell_and_two_swapped_values():
    folder = STUDIES / "siamese-vs-triplet"
    written = (folder / "results.md").read_text(encoding="utf-8")
    expected = rebuilt(folder)
    assert differences(written, expected) == []
    # another network's difference and p in a sentence
    euclidean, cosine = (re.search(rf"- {name}: .*?\((NDCG@10, trained - start model: [-+]\d\.\d+) \[[^\]]*\], (p [=<] [\d.]+)",
                                   written) for name in ("Triplet euclidean, margin 1", "Triplet euclidean, margin 0.2"))
    edited = written.replace(euclidean.group(0), euclidean.group(0).replace(euclidean.group(1), cosine.group(1)).replace(
        euclidean.group(2), cosine.group(2)), 1)
    assert edited != written and differences(edited, expected)
    # another network's cell in a table
    rows = [line for line in written.splitlines() if line.startswith("| Siamese cosine | 0.6")]
    other = [line for line in written.splitlines() if line.startswith("| Siamese euclidean | 0.1")]
    cell, other_cell = rows[0].split(" | ")[2], other[0].split(" | ")[2]
    edited = written.replace(rows[0], rows[0].replace(cell, other_cell), 1)
    assert edited != written and differences(edited, expected)
    # two NDCG values swapped
    models = json.loads((folder / "results.json").read_text())["models"]
    a, b = (f"{models[name]['scores']['ndcg@10']:.4f}" for name in ("siamese-cosine", "bm25"))
    edited = written.replace(a, "SWAP").replace(b, a).replace("SWAP", b)
    assert edited != written and differences(edited, expected)
    # and the README's paragraphs
    readme = summary.section()
    assert differences(readme.replace(a, b, 1), readme) or a not in readme


def families(results: dict) -> list:
    """The Holm families of a study's results.json: lists of the tests adjusted together."""
    tests = results["tests"]
    if "names" in results:  # compare-runs: one family
        return [list(tests.values())]
    experiment = results["settings"].get("experiment") or (
        "sbert-objectives" if "mnrl_vs_triplet" in tests else "embedding-size" if "base_moved" in tests
        else "siamese-vs-triplet" if "measures" in tests else "model-selection")
    if experiment == "sbert-objectives":
        names = [name for name in tests if name != "mnrl_vs_triplet"]
        return [[tests[name][metric] for name in names] for metric in ("spearman", "ndcg@10")] + [
            list(tests["mnrl_vs_triplet"].values())]
    return [[family] if "two_level" in family or "identical" in family else
            [t for t in family.values() if "tested_in" not in t] for family in tests.values()]


STORED = sorted(STUDIES.rglob("results.json"))


@pytest.mark.parametrize("path", STORED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_verdict_follows_from_its_stored_inference(path):
    results = json.loads(path.read_text(encoding="utf-8"))
    checked = 0
    for family in families(results):
        counted = [t for t in family if not t.get("identical") and "same_as" not in t]
        for key in ("p", "p_equivalence"):
            present = [t["two_level"] for t in counted if key in t["two_level"]]
            adjusted = significance.holm([t[key] for t in present]) if present else []
            assert [t[f"{key}_holm"] for t in present] == adjusted, f"{path}: a {key} is not Holm's over its family"
        for test in counted:
            inference, (word, sign) = test["two_level"], verdicts.outcome(test, "p_holm")
            assert (word == "prefers") == (inference["p_holm"] < verdicts.ALPHA)
            assert sign == (0 if word != "prefers" else 1 if inference["difference"] > 0 else -1)
            if "bound" in inference:  # the bound is where the same adjusted test turns
                assert (inference["bound"] < inference["margin"]) == (inference["p_equivalence_holm"] < verdicts.ALPHA)
                assert word != "equivalent" or inference["bound"] < inference["margin"]
            checked += 1
    assert checked


VERDICT_WITH_BOUND = re.compile(r"(?P<word>equivalent \(margin (?P<margin>[\d.]+)\)|not detectable|prefers )"
                                r"(?:(?!equivalent \(margin|not detectable|prefers ).)*?bound (?P<bound>[\d.]+)")


@pytest.mark.parametrize("path", WRITEUPS + [REPO / "README.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_every_printed_bound_agrees_with_the_verdict_beside_it(path):
    text = readme_study_section() if path.name == "README.md" else path.read_text(encoding="utf-8")
    found = list(VERDICT_WITH_BOUND.finditer(text))
    for match in found:  # printed to 4 decimals: a bound of 0.02 may sit beside either word
        bound = float(match["bound"])
        if match["word"].startswith("equivalent"):
            assert bound <= float(match["margin"]), match.group(0)
        elif match["word"] == "not detectable":
            assert bound >= verdicts.NDCG_MARGIN, match.group(0)
    assert found or not re.search(r"bound \d", text)


def test_the_bound_check_catches_a_verdict_that_does_not_follow():
    sentence = ("equivalent (margin 0.02) (NDCG@10, a - b: +0.0010 [-0.0100, +0.0120], p = 0.800; equivalence p = "
                "0.030, bound 0.0160; conditional: decides nothing: per query, given the seeds, p = 0.700)")
    (match,) = VERDICT_WITH_BOUND.finditer(sentence)
    assert float(match["bound"]) <= float(match["margin"])
    (wrong,) = VERDICT_WITH_BOUND.finditer(sentence.replace("equivalent (margin 0.02)", "not detectable"))
    assert not float(wrong["bound"]) >= verdicts.NDCG_MARGIN
    stored = {"difference": 0.001, "p_randomization": 0.7, "p_holm": 0.7,
              "two_level": {"difference": 0.001, "p": 0.8, "p_holm": 0.8, "margin": 0.02, "p_equivalence": 0.03,
                            "p_equivalence_holm": 0.03, "bound": 0.016}}
    assert verdicts.outcome(stored, "p_holm") == ("equivalent", 0)
    stored["two_level"]["p_equivalence_holm"] = 0.06  # adjusted p above alpha, bound still below the margin
    assert verdicts.outcome(stored, "p_holm")[0] == "not detectable"
    assert (stored["two_level"]["bound"] < 0.02) != (stored["two_level"]["p_equivalence_holm"] < verdicts.ALPHA)


def recomputed_tests(folder) -> dict:
    """The tests the study's own code computes from the folder's stored records (results.json's models)."""
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    if "names" in results:
        first, second = (json.loads((REPO / results[key] / "results.json").read_text()) for key in ("first", "second"))
        pairs = [tuple(pair.split(":")) for pair in results["tests"]]
        margin = verdicts.NDCG_MARGIN if results["metric"] == "ndcg@10" else None
        tested = verdicts.family([verdicts.claim(first["models"][a], second["models"][b], results["metric"], margin)
                                  for a, b in pairs])
        return {f"{a}:{b}": test for (a, b), test in zip(pairs, tested)}
    settings = argparse.Namespace(**results["settings"])
    experiment = json.loads((folder / "settings.json").read_text())["experiment"]
    if experiment == "siamese-vs-triplet":
        return siamese_vs_triplet.claims(settings, results["models"])
    if experiment == "embedding-size":
        return embedding_size.claims(settings, results["models"])
    if experiment == "model-selection":
        keys = [f"{key}@{k}" for _, key in model_selection.COLUMNS for k in settings.k]
        return model_selection.claims(results["models"], results["best"], keys)
    try:  # sbert-objectives: its Spearman tests need STS-B's gold scores, which results.json does not hold
        sts_test = datasets.load_stsb("test", folder=sbert_objectives.named_or_folder(settings.stsb, "stsb"))
    except (OSError, ValueError) as error:
        pytest.skip(f"{experiment}: STS-B's gold scores are not here ({error})")
    gold = np.array([pair.score for pair in sts_test], dtype=np.float64)
    return sbert_objectives.claims(results["models"], gold)


@pytest.mark.slow
@pytest.mark.parametrize("path", STORED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_stored_tests_are_what_the_code_computes_from_the_records(path, monkeypatch):
    monkeypatch.chdir(REPO)
    stored = json.loads(path.read_text(encoding="utf-8"))["tests"]
    assert json.loads(json.dumps(recomputed_tests(path.parent))) == stored


def test_a_claim_is_labelled_by_its_test_and_every_table_uses_the_four_labels():
    # A claimed preference: found, agrees; found the other way or within the margin, disagrees; a test that
    # tells neither way shows nothing, so "not shown", never "disagrees".
    assert runner.preference_label(("prefers", 1), 1) == runner.AGREES
    assert runner.preference_label(("prefers", -1), 1) == runner.DISAGREES
    assert runner.preference_label(("equivalent", 0), 1) == runner.DISAGREES
    assert runner.preference_label(("not detectable", 0), -1) == runner.NOT_SHOWN
    for path in WRITEUPS:
        text = path.read_text(encoding="utf-8")
        if "| the paper's claim |" not in text:
            continue
        table = text.split("| the paper's claim |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
        assert table and all(row.rsplit("|", 2)[-2].strip() in runner.LABELS for row in table), path
        assert runner.LABELS_SAID in text, path


def test_a_claim_about_one_network_against_every_other_needs_every_test(monkeypatch):
    # "Poorest" needs every other network found better; "preferred" every other found worse or within the
    # margin. One test the other way makes it disagree, one that tells neither way (and none the other
    # way) leaves it not shown; an identical network (one network under two names) is left out.
    monkeypatch.setattr(verdicts, "brief", lambda test, first, second: "figures")
    labels = {name: name.upper() for name in "abcd"}

    def label(outcomes: dict, good: set) -> str:
        tests = {name: {"identical": True} if word == "identical" else {"word": word}
                 for name, word in outcomes.items()}
        monkeypatch.setattr(verdicts, "outcome", lambda test, p_key: ("identical", 0) if test.get("identical")
                            else test["word"])
        return siamese_vs_triplet_report.family_claim(tests, labels, "a", True, good)[1]

    better, worse, equivalent, unclear = ("prefers", 1), ("prefers", -1), ("equivalent", 0), ("not detectable", 0)
    poorest, preferred = {better}, {better, equivalent}
    assert label({"b": better, "c": better, "d": "identical"}, poorest) == runner.AGREES
    assert label({"b": better, "c": unclear, "d": better}, poorest) == runner.NOT_SHOWN
    assert label({"b": better, "c": unclear, "d": equivalent}, poorest) == runner.DISAGREES
    assert label({"b": worse, "c": better, "d": better}, poorest) == runner.DISAGREES
    assert label({"b": better, "c": equivalent, "d": "identical"}, preferred) == runner.AGREES
    assert label({"b": better, "c": unclear, "d": equivalent}, preferred) == runner.NOT_SHOWN
    assert label({"b": worse, "c": unclear, "d": better}, preferred) == runner.DISAGREES


def test_the_gap_between_two_models_is_tested_as_a_difference_of_differences():
    # difference_of makes each query's accuracy@1 - accuracy@5, in every seed, so the claim's difference is
    # (top-1 gap) - (top-5 gap) between the two models, averaged over seeds and queries: computed here directly.
    rng = np.random.default_rng(0)
    queries = [f"q{i}" for i in range(40)]

    def model():
        runs = [{"per_query": {metric: dict(zip(queries, rng.integers(0, 2, 40).astype(float).tolist()))
                               for metric in ("accuracy@1", "accuracy@5")}} for _ in range(3)]
        mean = {metric: {q: float(np.mean([r["per_query"][metric][q] for r in runs])) for q in queries}
                for metric in ("accuracy@1", "accuracy@5")}
        seeds = [{metric: float(np.mean(list(r["per_query"][metric].values()))) for metric in mean} for r in runs]
        scores = {metric: float(np.mean(list(values.values()))) for metric, values in mean.items()}
        return {"per_query": mean, "runs": runs, "seeds": seeds, "scores": scores}

    large, small = model(), model()
    name = embedding_size_report.GAP_METRIC
    test = verdicts.claim(verdicts.difference_of(large, "accuracy@1", "accuracy@5"),
                          verdicts.difference_of(small, "accuracy@1", "accuracy@5"), name)
    per_seed = [[(a["per_query"]["accuracy@1"][q] - b["per_query"]["accuracy@1"][q])
                 - (a["per_query"]["accuracy@5"][q] - b["per_query"]["accuracy@5"][q]) for q in queries]
                for a, b in zip(large["runs"], small["runs"])]
    # Sums of whole numbers are exact in float64 in any order; only a division rounds (2^-53 of the value).
    assert test["two_level"]["difference"] == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert test["two_level"]["seeds"] == 3 and test["two_level"]["queries"] == 40
