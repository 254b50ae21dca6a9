"""Tests for minisbert/experiments: each study end to end on a tiny random model, resuming, the PCA.

What "correct" means for the experiment runner:
- each experiment runs end to end on the tiny random BERT of tests/fixtures and data/example and
  writes every file it promises: results.md with one row per model and one column per metric,
  results.json with the same numbers, the figures as PNG files under 200 KB;
- a rerun with the same --output trains and evaluates nothing again and writes the same results;
- a run killed between models, or by Ctrl-C in the middle of a model's training, goes on with what
  is missing and ends with exactly the results of an uninterrupted run (same scores, same losses);
- without matplotlib every table is still written, with a line saying how to get the figures;
- the PCA equals the reference: numpy's SVD of the centred matrix and the eigenvectors of the
  covariance matrix, and the exact answer for points on a line;
- bad input stops with a message naming it: an unknown experiment or model, a D larger than the
  model's dimension, a folder without the split the experiment needs, an output folder that holds a
  run with other settings.
"""

import argparse
import json
import os
import shutil
import signal
import time

import numpy as np
import pytest
import torch

from minisbert.training import checkpoints
from minisbert.evaluation import significance
from minisbert.experiments import verdicts, __main__ as command
from minisbert.experiments import (embedding_size, embedding_size_report, figures, model_selection, records, runner,
                                   sbert_objectives, siamese_vs_triplet, siamese_vs_triplet_report)
from minisbert.experiments.pca import fit_pca
from minisbert.common.fileio import read_json, write_json

from ..conftest import FIXTURES, REPO
from ..tolerances import float32_apart

TINY = FIXTURES / "tiny_bert"  # 2 layers, 32 dimensions, random weights, mean pooling
pytestmark = [pytest.mark.usefixtures("one_thread"),  # tiny tensors: see conftest.py
              pytest.mark.slow]  # the studies end to end: the slow suite (README, "Tests")


@pytest.fixture(autouse=True)
def embedding_cache(tmp_path, monkeypatch):
    """Corpus embeddings go to the test's own folder, not the repository's cache."""
    monkeypatch.setattr(runner, "EMBEDDING_CACHE", tmp_path / "cache")


def run(module, output, *options) -> dict:
    """`python -m minisbert.experiments NAME --quick --model TINY --output OUTPUT OPTIONS`, in-process."""
    module.main(["--quick", "--model", str(TINY), "--device", "cpu", "--output", str(output), *options])
    return json.loads((output / "results.json").read_text())


def table_rows(markdown: str, first_column: str) -> list:
    """The rows (lists of cells) of the markdown table whose header starts with `first_column`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return [rows[0]] + rows[2:]  # the header, then the rows after the |---| line


def assert_png(path):
    """A figure was drawn; the rest of the test is skipped, its tables already checked, where matplotlib
    (optional, README) is not installed, as the study then says in results.md instead."""
    if not figures.available():
        assert figures.MISSING in (path.parent / "results.md").read_text()
        pytest.skip("figures need matplotlib, which is optional and not installed: pip install matplotlib")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size < 200_000


def without_timing(results: dict) -> dict:
    """results.json less the wall-clock numbers (training seconds), which differ from run to run."""
    def strip(value, key=None):
        if isinstance(value, dict):
            return {k: strip(v, k) for k, v in value.items() if not (key == "training" and k == "seconds")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(results["models"])


# ---------------------------------------------------------------------------------------------
# siamese-vs-triplet


SVT_NETWORKS = ["siamese-cosine", "siamese-euclidean", "triplet-euclidean-margin1", "triplet-cosine-margin1",
                "triplet-euclidean-margin5", "triplet-cosine-margin5"]
SVT_MODELS = [f"{name}-seed42" for name in SVT_NETWORKS]  # one entry (folder) per network and seed


@pytest.fixture(scope="module")
def svt_run(tmp_path_factory):
    """One uninterrupted quick run: the reference the resumed runs are compared with."""
    output = tmp_path_factory.mktemp("svt") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "EMBEDDING_CACHE", output.parent / "cache")
        results = run(siamese_vs_triplet, output)
    return output, results


def test_siamese_vs_triplet_writes_the_table_and_both_figures(svt_run):
    output, results = svt_run
    assert list(results["models"]) == ["bm25", "untrained", "untrained-euclidean", *SVT_NETWORKS]
    rows = table_rows((output / "results.md").read_text(), "model")
    metrics = [f"{m}@{k}" for m in ("Precision", "Accuracy", "MRR", "NDCG") for k in (1, 5, 10)]
    assert rows[0] == ["model", "measure", *metrics]
    assert [row[:2] for row in rows[1:]] == [
        ["Siamese cosine", "cosine"], ["Siamese euclidean", "euclidean"],
        ["Triplet euclidean, margin 1", "euclidean"], ["Triplet cosine, margin 1", "cosine"],
        ["Triplet euclidean, margin 5", "euclidean"], ["Triplet cosine, margin 5", "cosine"],
        ["start model, untrained (cosine)", "cosine"], ["start model, untrained (euclidean)", "euclidean"],
        ["BM25", "bm25"]]
    names = SVT_NETWORKS + ["untrained", "untrained-euclidean", "bm25"]
    for name, row in zip(names, rows[1:]):  # the table shows what results.json holds
        scores = results["models"][name]["scores"]
        assert row[2:] == [f"{scores[f'{m}@{k}']:.4f}" for m in ("precision", "accuracy", "mrr", "ndcg") for k in (1, 5, 10)]
    # data/example: 8 training triplets, 16 pairs; 2 epochs of batches of 4.
    training_rows = table_rows((output / "results.md").read_text(), "model | NDCG@10")
    assert [row[-2:] for row in training_rows[1:]] == [["16", "8"]] * 2 + [["8", "4"]] * 4
    for name, entry in zip(SVT_NETWORKS, SVT_MODELS):
        trained = results["models"][name]["runs"][0]["training"]
        assert len(trained["loss"]) == trained["steps"]
        assert (output / "models" / entry / "final" / "model.safetensors").is_file()
        assert (output / "models" / entry / "result.json").is_file()
    assert "**Against the paper's finding**" in (output / "results.md").read_text()
    for pca in [results["models"]["untrained"]["pca"]] + [results["models"][n]["runs"][0]["pca"] for n in SVT_NETWORKS]:
        assert [np.shape(pca[role]) for role in ("query", "positive", "negative")] == [(5, 2)] * 3
        assert 0 < pca["explained"][1] <= pca["explained"][0] < 1
    assert_png(output / "loss.png")
    assert_png(output / "pca.png")
    assert_png(output / "differences.png")


def test_each_difference_in_the_report_is_the_test_of_the_per_query_scores(svt_run):
    output, results = svt_run
    models, tests = results["models"], results["tests"]
    for name, result in models.items():  # the per-query values average to the reported scores exactly
        for metric, values in result["per_query"].items():
            assert np.mean(list(values.values())) == result["scores"][metric], (name, metric)
    # Each network against the start model scored with its own measure, recomputed from per_query.
    for name in SVT_NETWORKS:
        start = models["untrained-euclidean" if "euclidean" in name else "untrained"]
        expected = significance.compare(models[name]["per_query"]["ndcg@10"], start["per_query"]["ndcg@10"],
                                        margin=verdicts.NDCG_MARGIN)
        test = tests["against_start"][name]
        if test.get("identical"):  # every query's value equal in every seed: reported as identical, not tested
            assert models[name]["per_query"]["ndcg@10"] == start["per_query"]["ndcg@10"]
            continue
        assert {k: test[k] for k in expected} == expected  # the conditional per-query figures
        assert test["p_holm"] >= expected["p_randomization"]
        assert test["p_equivalence_holm"] >= expected["p_equivalence"]
        # The inference: the crossed t of the seeds x queries table (one seed here: the paired t over queries).
        first, second = (np.array(list(m["per_query"]["ndcg@10"].values())) for m in (models[name], start))
        crossed = significance.crossed_t((first - second)[None], verdicts.NDCG_MARGIN)
        inference = test["two_level"]
        assert inference["ci95"] == crossed["ci95"]
        assert inference["p_holm"] >= inference["p"] == crossed["p"]
        # The bound is where the same Holm-adjusted equivalence test turns: it holds at the bound and not
        # 1e-9 below it (the bisection stops within 1e-10).
        others = [t["two_level"]["p_equivalence"] for other, t in tests["against_start"].items()
                  if other != name and not t.get("identical") and "same_as" not in t]
        def holds(margin):
            p_equivalence = significance.crossed_t((first - second)[None], margin)["p_equivalence"]
            return significance.holm([p_equivalence] + others)[0] < verdicts.ALPHA
        assert holds(inference["bound"]) and not holds(inference["bound"] - 1e-9)
    # The verdict sentences quote the tests.
    report = (output / "results.md").read_text()
    siamese = tests["measures"]["Siamese network"]
    assert verdicts.verdict(siamese, "NDCG@10", "cosine", "euclidean", p_key="p_holm") in report
    assert verdicts.difference_cell(tests["against_start"]["siamese-cosine"]) in report


def test_with_two_seeds_a_row_is_the_mean_and_the_tests_use_the_averaged_queries(tmp_path):
    results = run(siamese_vs_triplet, tmp_path / "run", "--seeds", "2", "--margins", "1")
    network = results["models"]["triplet-cosine-margin1"]
    assert [r["training"]["steps"] for r in network["runs"]] == [4, 4]
    assert network["runs"][0]["training"]["loss"] != network["runs"][1]["training"]["loss"]  # seeds 42 and 43
    assert (tmp_path / "run" / "models" / "triplet-cosine-margin1-seed43" / "final").is_dir()
    # float64 means of two values in [0, 1], here and in the runner: an ulp (1.1e-16) or two apart at most.
    # approx's default (relative 1e-6) for the scores is as far from that as from a wrong formula (ddof=0
    # would move the spread by 29%).
    for metric, values in network["per_query"].items():
        for query, value in values.items():
            assert value == pytest.approx(np.mean([r["per_query"][metric][query] for r in network["runs"]]), abs=1e-15)
        assert network["scores"][metric] == pytest.approx(np.mean([r["scores"][metric] for r in network["runs"]]))
        assert network["spread"][metric] == pytest.approx(np.std([r["scores"][metric] for r in network["runs"]], ddof=1))
    rows = table_rows((tmp_path / "run" / "results.md").read_text(), "model | NDCG@10")
    assert rows[1][1] == f"{results['models']['siamese-cosine']['scores']['ndcg@10']:.4f} ± " \
                         f"{results['models']['siamese-cosine']['spread']['ndcg@10']:.4f}"


def test_more_seeds_on_the_same_output_trains_only_the_new_seeds(svt_run, tmp_path, monkeypatch):
    output = tmp_path / "run"
    shutil.copytree(svt_run[0], output)
    train, trained = runner.train, []

    def counting(model, examples, spec, folder, *args, **kwargs):
        trained.append(folder.name)
        return train(model, examples, spec, folder, *args, **kwargs)

    monkeypatch.setattr(runner, "train", counting)
    results = run(siamese_vs_triplet, output, "--seeds", "2")
    assert trained == [f"{name}-seed43" for name in SVT_NETWORKS]
    first_seed = results["models"]["siamese-cosine"]["runs"][0]
    assert {k: v for k, v in first_seed.items() if k != "per_query"} == svt_run[1]["models"]["siamese-cosine"]["runs"][0]
    assert json.loads((output / "settings.json").read_text())["seeds"] == 2


def test_a_result_whose_per_query_values_do_not_match_it_is_refused(svt_run, tmp_path):
    output = tmp_path / "run"
    shutil.copytree(svt_run[0], output)
    path = output / "models" / "untrained" / "result.json"
    result = read_json(path)
    first_query = next(iter(result["per_query"]["ndcg@10"]))
    result["per_query"]["ndcg@10"][first_query] += 0.5
    write_json(path, result, digest=True)  # its digest made again: written so, not edited since
    with pytest.raises(ValueError, match=r"result.json: the 8 per-query values of ndcg@10 average to .*, not to the "
                                         r".* it reports; delete the file"):
        run(siamese_vs_triplet, output)


def test_a_rerun_trains_and_evaluates_nothing(svt_run, tmp_path, monkeypatch):
    reference, results = svt_run
    output = tmp_path / "run"
    shutil.copytree(reference, output)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a finished model was trained or evaluated again")

    monkeypatch.setattr(runner, "fit", must_not_run)
    monkeypatch.setattr(runner, "retrieval_scores", must_not_run)
    assert run(siamese_vs_triplet, output) == results


def stored_results_only(reference, output):
    """A copy of a finished run with what a GPU machine sends back: settings.json, run.json and each
    model's result.json and log.jsonl (no weights, checkpoints, embeddings, tables or figures)."""
    for path in reference.rglob("*"):
        if path.is_file() and path.name in ("settings.json", "run.json", "result.json", "log.jsonl"):
            (output / path.relative_to(reference)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, output / path.relative_to(reference))


@pytest.mark.parametrize("name", ["siamese-vs-triplet", "embedding-size", "sbert-objectives"])
def test_report_only_rebuilds_every_file_from_the_stored_results_alone(name, tmp_path, monkeypatch):
    module = {"siamese-vs-triplet": siamese_vs_triplet, "embedding-size": embedding_size,
              "sbert-objectives": sbert_objectives}[name]
    options = {"embedding-size": ["--dims", "8", "--synthetic", "300"]}.get(name, [])
    if name == "siamese-vs-triplet":
        options = ["--margins", "1"]
    if name == "sbert-objectives":  # small STS-B and SICK files, so that it runs without the real data
        stsb, sick = write_sts_and_sick(tmp_path / "data")
        options = ["--stsb", str(stsb), "--sick", str(sick), "--batch-size", "4"]
    reference = tmp_path / "reference"
    results = run(module, reference, *options)
    output = tmp_path / "stored"
    stored_results_only(reference, output)

    def must_not_run(*args, **kwargs):
        raise AssertionError("--report-only loaded a model or the training data")

    monkeypatch.setattr(runner, "load_model", must_not_run)
    monkeypatch.setattr(runner, "mined_triplets", must_not_run)
    # The settings come from the folder: the command line needs only the experiment and --output.
    module.main(["--report-only", "--output", str(output)])
    assert json.loads((output / "results.json").read_text()) == results
    assert (output / "results.md").read_text() == (reference / "results.md").read_text()
    for figure in reference.glob("*.png"):
        assert_png(output / figure.name)
    # A missing result is named, not made.
    (output / "models" / "untrained" / "result.json").unlink()
    with pytest.raises(ValueError, match=r"--report-only: .*untrained/result.json is missing"):
        module.main(["--report-only", "--output", str(output)])
    with pytest.raises(ValueError, match=r"--report-only: .*settings.json does not exist"):
        module.main(["--report-only", "--output", str(tmp_path / "empty")])


def test_the_report_names_the_machine_that_made_the_models_not_the_one_that_reads_them(svt_run, tmp_path,
                                                                                      monkeypatch):
    reference, _ = svt_run
    assert json.loads((reference / "run.json").read_text())["about"] in (reference / "results.md").read_text()
    output = tmp_path / "run"
    shutil.copytree(reference, output)
    (output / "run.json").write_text(json.dumps({"date": "2026-01-01", "about": "Trained on a machine elsewhere."}))
    siamese_vs_triplet.main(["--report-only", "--output", str(output)])
    assert "Trained on a machine elsewhere." in (output / "results.md").read_text()
    assert json.loads((output / "run.json").read_text())["date"] == "2026-01-01"  # reading back records nothing
    # results.json keeps the records beside the seeds, so it alone says which code and machine made it
    results = json.loads((output / "results.json").read_text())
    assert results["records"] == [{"date": "2026-01-01", "about": "Trained on a machine elsewhere."}]
    assert "seeds" in results["settings"]
    assert "code" in json.loads((reference / "results.json").read_text())["records"][0]  # None outside git


def test_a_run_on_a_gpu_is_recorded_with_the_gpu_s_name(monkeypatch):
    # A record that says "device cuda" alone does not say which GPU made the models.
    from minisbert.experiments import records
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    about = records.about_the_run(argparse.Namespace(), "cuda")
    assert about.startswith(f"Run on {time.strftime('%Y-%m-%d')}, device cuda (NVIDIA H100 80GB HBM3), ")
    assert ", device cpu, " in records.about_the_run(argparse.Namespace(), "cpu")


def test_a_budget_the_preset_sets_says_it_was_kept_where_a_gpu_made_the_models():
    # The preset is sized for 2 CPU cores; a deviations table of models made on a GPU says it was kept
    # there, so that it gives no reason that the committed runs' machine does not bear out.
    cpu = {"about": "Run on 2026-11-27, device cpu, 2 CPU cores (avx2), torch 2.13.0+cpu."}
    gpu = {"about": "Run on 2026-11-28, device cuda (NVIDIA H200), 16 CPU cores (avx2), torch 2.11.0+cu130."}
    assert records.preset_why(cpu) == "the preset's (made for 2 CPU cores)"
    assert records.preset_why({**cpu, "earlier": [gpu]}) == "the preset's (made for 2 CPU cores, and kept on the GPU)"


def test_a_run_continued_elsewhere_keeps_the_earlier_record_and_says_which_machine_made_which_models(
        svt_run, tmp_path, monkeypatch):
    # The first seed's models were made "elsewhere", before the margin was recorded; --seeds 2 here
    # makes the second seed's. run.json keeps both records, and the report names both machines, the
    # models each made, and that only part of the run predates the margin's record.
    output = tmp_path / "run"
    shutil.copytree(svt_run[0], output)
    (output / "run.json").write_text(json.dumps({"date": "2026-01-01", "about": "Trained on a machine elsewhere."}))
    run(siamese_vs_triplet, output, "--seeds", "2")
    record = json.loads((output / "run.json").read_text())
    assert record["earlier"] == [{"date": "2026-01-01", "about": "Trained on a machine elsewhere."}]
    assert record["models"] == [f"{name}-seed43" for name in SVT_NETWORKS] and record["margin"] == 0.02
    report = (output / "results.md").read_text()
    assert "Made in 2 runs" in report and "Trained on a machine elsewhere. (its models not recorded.)" in report
    assert f"{record['about']} (models {', '.join(record['models'])}.)" in report
    assert "Part of this run predates the margin's record" in report
    assert "the run of 2026-01-01 (its models not recorded)" in report


def test_training_times_are_given_per_machine_from_run_json():
    # A record without a models list made the models that no other record lists; each machine gets
    # the range of its own networks' times, and the reason names run.json's notes only where a note
    # tells of training times.
    run = {"date": "2", "about": "Run on 2, device cpu, 2 CPU cores (avx2).", "models": ["a-seed43", "b-seed43"],
           "earlier": [{"date": "1", "about": "Run on 1, device cuda:0 (a GPU), 16 CPU cores (avx2)."}]}
    seconds = {"a-seed42": 6.0, "b-seed42": 18.0, "a-seed43": 600.0, "b-seed43": 4380.0}
    assert records.minutes(run, seconds) == "cuda:0 (a GPU): 0.1 to 0.3 min a network; cpu: 10.0 to 73.0 min a network"
    assert records.time_why(run) == "the machines the models were made on (run.json)"
    run["note"] = "training times: b-seed43 shared the machine"
    assert records.time_why(run).endswith("(run.json; its notes say which times a shared or stopped machine "
                                          "lengthened)")
    single = {"date": "1", "about": "Run on 1, device cpu, 2 CPU cores (avx2)."}
    assert records.minutes(single, {"a-seed42": 60.0, "b-seed42": 60.0}) == "cpu: 1.0 min a network"


def test_compare_runs_tests_each_pair_of_models_across_two_runs(svt_run, tmp_path):
    reference, results = svt_run
    output = tmp_path / "compared"
    command.main(["compare-runs", str(reference), str(reference), "--pairs",
                  "triplet-euclidean-margin1:triplet-cosine-margin1", "untrained:untrained", "--output", str(output),
                  "--names", "this", "that"])
    tests = json.loads((output / "results.json").read_text())["tests"]
    models = results["models"]
    expected = verdicts.family([verdicts.claim(models["triplet-euclidean-margin1"], models["triplet-cosine-margin1"],
                                           "ndcg@10", verdicts.NDCG_MARGIN),
                              verdicts.claim(models["untrained"], models["untrained"], "ndcg@10", verdicts.NDCG_MARGIN)])
    assert list(tests.values()) == expected
    same = tests["untrained:untrained"]
    assert same == {"identical": True, "difference": 0.0}  # every difference 0: nothing to test
    report = (output / "results.md").read_text()
    assert "- untrained: identical: this and that give every query an equal NDCG@10 in every seed (not tested)" in report
    command.main(["compare-runs", str(reference), str(reference), "--output", str(output)])
    assert list(json.loads((output / "results.json").read_text())["tests"]) == [f"{n}:{n}" for n in SVT_NETWORKS]
    with pytest.raises(SystemExit, match="holds no per-query ndcg@10 for a model named 'nothing'"):
        command.main(["compare-runs", str(reference), str(reference), "--pairs", "nothing:untrained",
                      "--output", str(output)])


def test_a_run_killed_between_models_goes_on_with_the_remaining_ones(svt_run, tmp_path, monkeypatch):
    _, expected = svt_run
    output = tmp_path / "run"
    train, trained = runner.train, []

    def killed_at_the_third_model(model, examples, spec, folder, *args, **kwargs):
        if len(trained) == 2:
            raise SystemExit("killed")
        trained.append(folder.name)
        return train(model, examples, spec, folder, *args, **kwargs)

    monkeypatch.setattr(runner, "train", killed_at_the_third_model)
    with pytest.raises(SystemExit, match="killed"):
        run(siamese_vs_triplet, output)
    assert trained == SVT_MODELS[:2]
    assert not (output / "results.json").exists()

    def counting(model, examples, spec, folder, *args, **kwargs):
        trained.append(folder.name)
        return train(model, examples, spec, folder, *args, **kwargs)

    monkeypatch.setattr(runner, "train", counting)
    results = run(siamese_vs_triplet, output)
    assert trained == SVT_MODELS  # the first two from the first run, the others from the second
    assert without_timing(results) == without_timing(expected)


def test_ctrl_c_while_a_model_trains_resumes_from_its_checkpoint(svt_run, tmp_path, monkeypatch):
    _, expected = svt_run
    output = tmp_path / "run"
    append_log, pressed = checkpoints.append_log, []

    def ctrl_c_at_step_3_of_the_second_model(path, entry):
        append_log(path, entry)
        if path.parent.name == "siamese-euclidean-seed42" and entry["step"] == 3 and not pressed:
            pressed.append(entry["step"])
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(checkpoints, "append_log", ctrl_c_at_step_3_of_the_second_model)
    with pytest.raises(SystemExit) as stopped:
        command.main(["siamese-vs-triplet", "--quick", "--model", str(TINY), "--device", "cpu", "--output", str(output)])
    assert stopped.value.code == 130
    assert checkpoints.load_checkpoint(output / "models" / "siamese-euclidean-seed42" / "checkpoint.pt")["step"] == 3
    assert not (output / "models" / "siamese-euclidean-seed42" / "result.json").exists()
    results = run(siamese_vs_triplet, output)
    assert without_timing(results) == without_timing(expected)


def test_without_matplotlib_the_tables_are_written_and_a_line_says_how_to_get_the_figures(
        svt_run, tmp_path, monkeypatch):
    output = tmp_path / "run"
    shutil.copytree(svt_run[0], output)
    for figure in output.glob("*.png"):
        figure.unlink()
    monkeypatch.setattr(figures, "available", lambda: False)
    run(siamese_vs_triplet, output)
    assert figures.MISSING in (output / "results.md").read_text()
    assert len(table_rows((output / "results.md").read_text(), "model")) == 10
    assert not list(output.glob("*.png"))


def test_figures_need_only_their_own_module_to_import_matplotlib():
    sources = {path.name: path.read_text() for path in (REPO / "minisbert").rglob("*.py")}
    assert [name for name, text in sources.items() if "import matplotlib" in text] == ["figures.py"]


# ---------------------------------------------------------------------------------------------
# embedding-size, sbert-objectives, model-selection


def test_embedding_size_writes_a_row_per_size_and_the_figure(tmp_path):
    output = tmp_path / "run"
    results = run(embedding_size, output, "--dims", "16", "8", "64", "--synthetic", "300")
    assert list(results["models"]) == ["jaccard", "untrained", "untrained-euclidean", "pca16", "pca8", "pca64",
                                       "base", "d16", "d8", "d64"]
    rows = table_rows((output / "results.md").read_text(), "model")
    assert rows[0] == ["model", "NDCG@10", "Accuracy@1", "Accuracy@10", "difference from the start model",
                       "difference from the base model",
                       "untrained PCA projection, NDCG@10", "difference from the untrained projection",
                       "queries/s, test corpus", "queries/s, 300 random", "training time", "steps"]
    assert [row[0] for row in rows[1:]] == ["D = 16", "D = 8", "D = 64", "base model: trained, no projection (D = 32)",
                                            "start model, untrained, euclidean (D = 32)",
                                            "start model, untrained, cosine (D = 32)", "Jaccard (words)"]
    for dim, row in zip((16, 8, 64), rows[1:]):
        trained = results["models"][f"d{dim}"]
        assert row[1:4] == [f"{trained['scores'][m]:.4f}" for m in ("ndcg@10", "accuracy@1", "accuracy@10")]
        assert row[4] == verdicts.difference_cell(results["tests"]["against_start"][str(dim)])
        assert row[5] == verdicts.difference_cell(results["tests"]["against_base"][str(dim)])
        assert row[-1] == "4"  # 8 triplets, batches of 4, 2 epochs
        assert np.load(output / "models" / f"d{dim}-seed42" / "corpus.npy").shape == (48, dim)  # each its own size
    speed = results["search_speed"]
    assert len(speed["test"]) == len(speed["synthetic"]) == 3 and min(speed["test"] + speed["synthetic"]) > 0
    assert_png(output / "dims.png")


def test_the_projection_starts_from_the_pca_or_the_padded_identity(tmp_path):
    model = embedding_size.unnormalised(runner.load_model(str(TINY), "cpu"))
    triplets = runner.mined_triplets("example", "train", runner.load_model(str(TINY), "cpu"), seed=42)[1]
    texts = sorted({text for t in triplets for text in t.texts})
    embeddings = model.encode(texts).astype(np.float64)  # (n, 32)
    weight, bias = embedding_size.starting_projections(model, triplets, [8, 16])[8]
    projected = embeddings @ weight.double().numpy().T + bias.double().numpy()  # (n, 8)
    reference = fit_pca(embeddings, k=8).project(embeddings)
    # The projection is the PCA, in float32: its unit directions rounded (u·|x| at most for a point x), the
    # mean rounded and its 32 products with a direction summed (tolerances.py).
    apart = float32_apart(32 + 2) * np.linalg.norm(embeddings, axis=1).max()
    np.testing.assert_allclose(projected, reference, rtol=0, atol=apart)
    np.testing.assert_allclose(projected.mean(axis=0), 0, rtol=0, atol=apart)  # centred
    # Above the width: the first 32 coordinates are the embedding itself, the other 32 are 0.
    weight, bias = embedding_size.starting_projections(model, triplets, [64])[64]
    padded = embeddings @ weight.double().numpy().T + bias.double().numpy()
    np.testing.assert_array_equal(padded[:, :32], embeddings)
    assert not padded[:, 32:].any()
    # So the untrained projection to 64 retrieves exactly as the start model with euclidean distance does.
    results = run(embedding_size, tmp_path / "run", "--dims", "64", "--synthetic", "300")
    assert results["models"]["pca64"]["per_query"] == results["models"]["untrained-euclidean"]["per_query"]


def test_the_projection_trains_at_its_own_learning_rate(tmp_path):
    run(embedding_size, tmp_path / "run", "--dims", "8", "--synthetic", "300", "--projection-lr", "0.003")
    checkpoint = checkpoints.load_checkpoint(tmp_path / "run" / "models" / "d8-seed42" / "checkpoint.pt")
    groups = checkpoint["optimizer"]["param_groups"]
    # Each group's rate before the schedule scales it (after the last step the schedule has decayed
    # both to 0, so the rates the optimizer holds cannot tell them apart).
    base_rates = checkpoint["scheduler"]["base_lrs"]
    assert len(base_rates) == len(groups)
    rates = {name.startswith("dense."): base for group, base in zip(groups, base_rates) for name in group["param_names"]}
    assert rates == {True: 0.003, False: 2e-5}  # the flags' values, stored as given


def write_quora(folder, duplicates: int = 20):
    """quora_duplicate_questions.tsv: `duplicates` duplicate pairs, each first question also paired with
    a question judged not its duplicate."""
    folder.mkdir()
    lines = ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"]
    for i in range(duplicates):
        a, b, c = 3 * i + 1, 3 * i + 2, 3 * i + 3
        lines.append(f"{2 * i}\t{a}\t{b}\tis the {i} man eating\tdoes the {i} man eat food\t1")
        lines.append(f"{2 * i + 1}\t{a}\t{c}\tis the {i} man eating\tis the {i} dog walking\t0")
    (folder / "quora_duplicate_questions.tsv").write_text("\n".join(lines) + "\n")
    return folder


def test_quora_duplicates_split_80_15_5_with_the_files_own_negatives(tmp_path):
    triplets, test = runner.quora_data(str(write_quora(tmp_path / "quora")), seed=3)
    assert len(triplets) == 16 and len(test.qrels) == 2 * 3  # 80 % and 15 % of 20 pairs; both questions query
    for anchor, positive, negative in (t.texts for t in triplets):
        number = anchor.split()[2]
        assert (positive, negative) == (f"does the {number} man eat food", f"is the {number} dog walking")
    for question, judged in test.qrels.items():
        (duplicate,) = judged
        assert test.qrels[duplicate] == {question: 1} and test.queries[question] == test.corpus[question]
    assert not {t.texts[0] for t in triplets} & set(test.queries.values())  # no test question is trained on


def test_verdicts_say_what_the_tests_can_tell():
    def outcome(difference, p, p_equivalence=None):
        inference = {"difference": difference, "ci95": [difference - 0.01, difference + 0.01], "p": p, "p_holm": p}
        if p_equivalence is not None:
            inference |= {"margin": 0.02, "p_equivalence": p_equivalence, "p_equivalence_holm": p_equivalence,
                          "bound": 0.015}
        # the conditional per-query figures say the opposite, and decide nothing
        return {"difference": difference, "ci95": [0.1, 0.2], "p_randomization": 0.5 if p < 0.05 else 0.001,
                "p_holm": 0.5 if p < 0.05 else 0.001, "two_level": inference}
    assert verdicts.verdict(outcome(-0.4, 0.001), "NDCG@10", "D = 8", "base", "p_holm").startswith("prefers base (")
    # p above 0.05 and no equivalence test: the interval, never "no difference"
    said = verdicts.verdict(outcome(0.001, 0.8), "NDCG@10", "D = 32", "base", "p_holm")
    assert said.startswith("not detectable after Holm's adjustment; the unadjusted 95% interval runs from -0.0090 to "
                           "+0.0110 (")
    # p above 0.05 and the equivalence test passes: equivalent within the margin
    said = verdicts.verdict(outcome(0.001, 0.8, 0.01), "NDCG@10", "D = 32", "base", "p_holm")
    assert said.startswith("equivalent (margin 0.02) (") and "equivalence p = 0.010, bound 0.0150;" in said
    assert said.endswith("conditional: decides nothing: per query, given the seeds, p = 0.001)")
    assert verdicts.verdict(outcome(0.001, 0.8, 0.2), "NDCG@10", "a", "b", "p_holm").startswith("not detectable")
    tests = {"base_moved": outcome(-0.04, 0.02),
             "against_start": {"8": outcome(-0.4, 0.001), "32": outcome(0.001, 0.8)},
             "against_projection": {"8": outcome(0.0, 0.9), "32": outcome(0.0, 0.9)},
             "against_base": {"8": outcome(-0.4, 0.001), "32": outcome(0.001, 0.8)}}
    summary = embedding_size_report.training_summary(tests, [8, 32])
    assert ("- D = 32 against the base: not detectable after Holm's adjustment; the unadjusted 95% interval runs "
            "from -0.0090 to +0.0110") in summary
    assert "- D = 8 against the base: prefers base (" in summary


def test_the_papers_finding_is_judged_by_the_one_inference_whatever_the_conditional_figures_say():
    # Triplet at margin 0.2: the per-query test and the t over the seeds both prefer euclidean, but the
    # two-level interval crosses 0: the paper's preference is not reproduced
    seeds = {"difference": -0.015, "ci95": [-0.03, -0.001], "p": 0.01, "p_holm": 0.01, "seeds": 5}
    split = {"difference": -0.015, "ci95": [-0.029, -0.001], "p_randomization": 0.001, "p_holm": 0.001,
             "seed_level": seeds, "two_level": {"difference": -0.015, "ci95": [-0.035, 0.004], "p": 0.09,
                                                "p_holm": 0.09}}
    said = siamese_vs_triplet_report.agreement("Triplet network, margin 0.2", split)
    assert said == "the paper's preference is not reproduced here"
    found = split | {"two_level": split["two_level"] | {"p": 0.01, "p_holm": 0.02}}
    assert siamese_vs_triplet_report.agreement("Triplet network, margin 0.2", found) == "as the paper finds"
    opposite = found | {"two_level": found["two_level"] | {"difference": 0.015}}
    assert siamese_vs_triplet_report.agreement("Triplet network, margin 0.2", opposite) == "the opposite of the paper"


def test_embedding_size_reads_quoras_layout_and_no_question_finds_itself(tmp_path):
    results = run(embedding_size, tmp_path / "run", "--data", str(write_quora(tmp_path / "quora")), "--dims", "8")
    assert list(results["models"]) == ["jaccard", "untrained", "untrained-euclidean", "pca8", "base", "d8"]
    # 3 test pairs pooled into 6 questions. By word-set Jaccard, "is the 3 man eating" is nearer the two
    # other "is the N man eating" (4 words of 6 shared) than its duplicate "does the 3 man eat food"
    # (3 of 8), which is nearer than the other two "does the N man eat food" (2 of 8); the same holds
    # the other way round. So every duplicate ranks 3rd, MRR 1/3; had a question found itself
    # (Jaccard 1), the duplicate would rank 4th.
    assert results["models"]["jaccard"]["scores"]["mrr@10"] == pytest.approx(1 / 3)  # a float64 mean of thirds


def write_sts_and_sick(folder):
    """Tiny STS-B (sts-*.csv: score in column 5, sentences in 6 and 7) and SICK (SICK_*.txt) folders."""
    pairs = [("a man is eating food", "a man is eating a piece of bread", 3.8, "ENTAILMENT"),
             ("a girl walks in the park", "the girl is eating", 1.2, "NEUTRAL"),
             ("they play with a dog", "a dog and a cat play", 2.5, "NEUTRAL"),
             ("the baby is carrying bread", "a baby carries a piece of bread", 4.6, "ENTAILMENT"),
             ("a man walks in the park", "nobody walks in the park", 1.0, "CONTRADICTION"),
             ("the cat is quick", "a quick cat", 4.0, "ENTAILMENT")]
    (folder / "stsb").mkdir(parents=True)
    (folder / "sick").mkdir()
    for split in ("train", "dev", "test"):
        (folder / "stsb" / f"sts-{split}.csv").write_text(
            "".join(f"main-captions\tMSRvid\t2012\t{i:04d}\t{score * 5 / 4.6:.3f}\t{a}\t{b}\n"
                    for i, (a, b, score, _) in enumerate(pairs)))
    header = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
    for name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        (folder / "sick" / name).write_text(header + "".join(f"{i}\t{a}\t{b}\t{score}\t{label}\n"
                                                             for i, (a, b, score, label) in enumerate(pairs)))
    return folder / "stsb", folder / "sick"


def test_sbert_objectives_writes_one_row_per_objective(tmp_path):
    stsb, sick = write_sts_and_sick(tmp_path / "data")
    output = tmp_path / "run"
    results = run(sbert_objectives, output, "--stsb", str(stsb), "--sick", str(sick), "--batch-size", "4")
    assert list(results["models"]) == ["untrained", "classification", "regression", "triplet", "mnrl"]
    rows = table_rows((output / "results.md").read_text(), "model")
    assert rows[0] == ["model", "trained on", "STS-B test Spearman", "difference from the start model",
                       "example test NDCG@10", "difference from the start model", "training time", "examples", "steps"]
    assert [row[0] for row in rows[1:]] == ["start model, untrained", "classification (softmax)",
                                            "regression (cosine MSE)", "triplet (euclidean, margin 1)",
                                            "MNRL, hard negatives (beyond SBERT's paper)"]
    assert [row[7:] for row in rows[2:]] == [["6", "2"], ["6", "2"], ["8", "2"], ["8", "2"]]  # 6 pairs, 8 triplets
    for name, row in zip(results["models"], rows[1:]):
        scores = results["models"][name]["scores"]
        assert [row[2], row[4]] == [f"{scores['spearman']:.4f}", f"{scores['ndcg@10']:.4f}"]
        assert -1 <= scores["spearman"] <= 1 and 0 <= scores["ndcg@10"] <= 1
    # Each objective's differences from the start model are the tests of its STS cosines and per-query NDCG@10.
    gold = [p.score for p in sbert_objectives.datasets.load_stsb("test", folder=stsb)]
    models, tests = results["models"], results["tests"]
    for name in ("classification", "regression", "triplet", "mnrl"):
        spearman = significance.spearman_difference(models[name]["sts_cosine"], models["untrained"]["sts_cosine"], gold)
        assert {k: tests[name]["spearman"][k] for k in spearman} == spearman
        # the same two float64 correlations subtracted, here and in significance.spearman_difference: an ulp apart
        assert spearman["difference"] == pytest.approx(models[name]["scores"]["spearman"]
                                                       - models["untrained"]["scores"]["spearman"], abs=1e-12)
        assert verdicts.difference_cell(tests[name]["spearman"]) in (output / "results.md").read_text()


def test_sbert_objectives_classification_head_starts_from_the_seed(tmp_path):
    # The softmax head is drawn from torch's generator: whatever drew from it before must not change the run.
    stsb, sick = write_sts_and_sick(tmp_path / "data")
    cosines = []
    for earlier_seed in (1, 2):
        torch.manual_seed(earlier_seed)
        results = run(sbert_objectives, tmp_path / f"run{earlier_seed}", "--stsb", str(stsb), "--sick", str(sick),
                      "--batch-size", "4")
        cosines.append(results["models"]["classification"]["sts_cosine"])
    assert cosines[0] == cosines[1]


def test_model_selection_tests_every_candidate_against_the_best(svt_run, tmp_path):
    output = tmp_path / "run"
    trained = svt_run[0] / "models" / "triplet-cosine-margin1-seed42"  # an experiment's model folder: final/ is used
    models = [str(TINY), str(trained), "bm25", "jaccard"]
    module_args = ["--quick", "--device", "cpu", "--output", str(output), "--model", *models]
    model_selection.main(module_args)
    written = json.loads((output / "results.json").read_text())
    results = written["models"]
    assert list(results) == models
    # NDCG@10 and MRR@10 read the same in both definition sets on binary judgments: as the study scored it.
    for key in ("ndcg@10", "mrr@10"):
        assert results[str(trained)]["scores"][key] == svt_run[1]["models"]["triplet-cosine-margin1"]["runs"][0]["scores"][key]
    rows = table_rows((output / "results.md").read_text(), "model")
    assert rows[0][:6] == ["model", "NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "NDCG@100"] and len(rows[0]) == 21
    for column, key in enumerate([f"{m}@{k}" for m in ("ndcg", "map", "recall", "precision") for k in (1, 3, 5, 10, 100)], 1):
        best = max(result["scores"][key] for result in results.values())
        for name, row in zip(models, rows[1:]):
            value = results[name]["scores"][key]
            assert row[column] == (f"**{value:.4f}**" if value == best else f"{value:.4f}")
    # trec_eval's MAP@k divides by every relevant document, and every other candidate is tested against the best.
    best = written["best"]
    assert best == max(results, key=lambda name: results[name]["scores"]["ndcg@10"])
    others = [name for name in models if name != best]
    for key, tests in written["tests"].items():
        assert list(tests) == others
        if "tested_in" in tests[others[0]]:  # the same value on every query of every model as a metric tested before
            earlier = tests[others[0]]["tested_in"]
            assert all(verdicts.per_seed(results[name], key) == verdicts.per_seed(results[name], earlier)
                       for name in results) and "tested_in" not in written["tests"][earlier][others[0]]
            continue
        margin = verdicts.NDCG_MARGIN if key == "ndcg@10" else None  # equivalence is tested on NDCG@10 alone
        expected = verdicts.family([verdicts.claim(results[name], results[best], key, margin) for name in others])
        assert list(tests.values()) == expected
    assert verdicts.verdict(model_selection.tested(written["tests"], "ndcg@10")[others[0]], "NDCG@10", others[0], best,
                            "p_holm") in \
        (output / "results.md").read_text()


def test_model_selection_trains_its_own_candidates_with_every_seed(tmp_path):
    output = tmp_path / "run"
    model_selection.main(["--quick", "--device", "cpu", "--output", str(output), "--model", str(TINY), "bm25",
                          "--train", "mnrl", "--start", str(TINY), "--seeds", "2", "--examples", "8"])
    written = json.loads((output / "results.json").read_text())
    trained = written["models"]["MNRL (trained here)"]
    assert [run["training"]["examples"] for run in trained["runs"]] == [8, 8]
    assert sorted(p.name for p in (output / "models").iterdir() if p.name.startswith("train-")) == \
        ["train-mnrl-seed42", "train-mnrl-seed43"]
    # The row is the mean of its two seeds, query by query, and its test carries the t over the seeds.
    for query, value in trained["per_query"]["ndcg@10"].items():
        assert value == np.mean([run["per_query"]["ndcg@10"][query] for run in trained["runs"]])
    best, tests = written["best"], written["tests"]["ndcg@10"]
    if best != "MNRL (trained here)":
        assert tests["MNRL (trained here)"]["seed_level"]["seeds"] == 2
    else:  # the best is the trained one: each other candidate is tested against its seeds
        assert all(test["seed_level"]["seeds"] == 2 for test in tests.values())
    markdown = (output / "results.md").read_text()
    assert "seeds 42, 43" in markdown and "a t over the seeds' own differences" in markdown
    model_selection.main(["--report-only", "--output", str(output)])
    assert (output / "results.md").read_text() == markdown


def test_a_t_over_the_seeds_stands_beside_either_side_that_has_them():
    def model(seed_scores, queries):
        result = {"per_query": {"ndcg@10": queries}, "scores": {"ndcg@10": float(np.mean(list(queries.values())))}}
        if seed_scores:
            result["seeds"] = [{"ndcg@10": value} for value in seed_scores]
        return result
    queries = {f"q{i}": i / 10 for i in range(10)}
    trained = model([0.50, 0.56, 0.47], {q: v + 0.01 for q, v in queries.items()})
    given = model([], queries)
    forward, backward = verdicts.claim(trained, given, "ndcg@10"), verdicts.claim(given, trained, "ndcg@10")
    assert forward["seed_differences"] == [x - given["scores"]["ndcg@10"] for x in (0.50, 0.56, 0.47)]
    assert backward["seed_differences"] == [given["scores"]["ndcg@10"] - x for x in (0.50, 0.56, 0.47)]
    assert backward["seed_level"]["p"] == forward["seed_level"]["p"] == significance.paired_t_test(
        [0.50, 0.56, 0.47], [given["scores"]["ndcg@10"]] * 3)
    assert "seed_level" not in verdicts.claim(given, model([], queries | {"q0": 0.3}), "ndcg@10")


def test_model_selection_checks_every_model_before_evaluating_any(tmp_path):
    with pytest.raises(ValueError, match="'no-such-model' is neither a model directory nor a known model name"):
        model_selection.main(["--quick", "--output", str(tmp_path / "run"), "--model", str(TINY), "bm25", "no-such-model"])
    assert not (tmp_path / "run").exists()


def test_model_selection_reads_a_question_answer_csv(tmp_path, monkeypatch):
    monkeypatch.setattr(model_selection, "CACHE_DIR", tmp_path / "cache")
    rows = [("how long should bread rise", "until the dough has doubled"), ("why is the sky blue", "air scatters blue light"),
            ("when to water tomatoes", "early in the morning")]
    (tmp_path / "qa.csv").write_text("question,answer\n" + "".join(f"{q},{a}\n" for q, a in rows))
    output = tmp_path / "run"
    model_selection.main(["--data", str(tmp_path / "qa.csv"), "--output", str(output), "--model", "bm25", str(TINY)])
    results = json.loads((output / "results.json").read_text())["models"]
    assert results["bm25"]["scores"]["recall@10"] == 1.0  # 3 answers: each question's is in its top 10
    assert "3 queries over 3 documents" in (output / "results.md").read_text()


def test_model_selection_refuses_a_csv_without_an_answer_column(tmp_path, monkeypatch):
    monkeypatch.setattr(model_selection, "CACHE_DIR", tmp_path / "cache")
    (tmp_path / "qa.csv").write_text("question,reply\nwhy is the sky blue,air scatters blue light\n")
    with pytest.raises(ValueError, match=r"qa.csv: the header \(line 1\) lacks the column\(s\) \['answer'\]"):
        model_selection.main(["--data", str(tmp_path / "qa.csv"), "--output", str(tmp_path / "run"), "--model", "bm25"])
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# PCA


U64 = np.finfo(np.float64).eps / 2  # float64's unit roundoff


def decompositions_apart(points) -> float:
    """How far two float64 decompositions of `points` (n, d) (torch's LAPACK is MKL's, numpy's OpenBLAS's)
    may lie apart, per unit of the largest value. Each is the exact decomposition of the matrix plus an error
    of norm up to c·u·(its largest value), c a small multiple of the sizes (c = n·d here), so a value moves by
    that much at most and a direction by that over its gap to the nearest other value (Golub and Van Loan,
    "Matrix Computations", 4th ed., section 8.6.1). Doubled: two computations. The PCA tests below measure
    10 to 500 times less."""
    return 2 * points.size * U64


def test_pca_equals_the_svd_of_the_centred_matrix_and_the_covariance_eigenvectors():
    points = np.random.default_rng(0).normal(size=(50, 6)) @ np.diag([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    pca = fit_pca(points, k=3)
    centred = points - points.mean(axis=0)
    _, singular_values, vt = np.linalg.svd(centred, full_matrices=False)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(points, rowvar=False))  # ascending
    error = decompositions_apart(points)

    def apart(values):  # (relative error of the third value, error of the first three directions)
        return error * values[0] / values[2], error * values[0] / min(values[:3] - values[1:4])

    svd_value, svd_direction = apart(singular_values)
    eig_value, eig_direction = apart(eigenvalues[::-1])
    for i in range(3):  # each direction up to its sign, which fit_pca fixes: largest |coordinate| positive
        reference = vt[i] * np.sign(vt[i][np.abs(vt[i]).argmax()])
        np.testing.assert_allclose(pca.components[i].numpy(), reference, rtol=0, atol=svd_direction)
        eigenvector = eigenvectors[:, -1 - i] * np.sign(eigenvectors[np.abs(eigenvectors[:, -1 - i]).argmax(), -1 - i])
        np.testing.assert_allclose(pca.components[i].numpy(), eigenvector, rtol=0, atol=svd_direction + eig_direction)
    variance_apart = 2 * svd_value  # σ² doubles σ's relative error
    np.testing.assert_allclose(pca.explained_variance.numpy(), singular_values[:3] ** 2 / 49, rtol=variance_apart)
    np.testing.assert_allclose(pca.explained_variance.numpy(), eigenvalues[::-1][:3], rtol=variance_apart + eig_value)
    np.testing.assert_allclose(pca.explained_ratio.numpy(), singular_values[:3] ** 2 / (singular_values**2).sum(),
                               rtol=2 * variance_apart)  # and the sum's, which σ1² dominates
    # A projection is a sum of d = 6 products of a centred point and a unit direction: 6 roundings, each of at
    # most u·|point| (Higham, section 3.1).
    np.testing.assert_allclose(pca.project(points), centred @ pca.components.numpy().T, rtol=0,
                               atol=2 * 6 * U64 * np.linalg.norm(centred, axis=1).max())


def test_pca_of_points_on_a_line_finds_the_line():
    t = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    points = np.array([1.0, 1.0]) + t[:, None] * np.array([0.6, -0.8])  # on the line through (1, 1), direction (3, -4) / 5
    pca = fit_pca(points, k=1)
    error = decompositions_apart(points)  # the other value is rounding noise: the direction's gap is σ1
    np.testing.assert_allclose(pca.components[0].numpy(), [-0.6, 0.8], rtol=0, atol=error)  # -0.8 < 0: flipped
    np.testing.assert_allclose(pca.explained_variance.numpy(), [np.var(t, ddof=1)], rtol=2 * error)  # 2.5; σ²
    # σ2 is at most error·σ1: its square is below half an ulp of σ1², so the ratio rounds to 1 exactly.
    np.testing.assert_array_equal(pca.explained_ratio.numpy(), [1.0])
    # The points are rounded when made (1 + t·0.6), then centred and projected: about 10 u (1e-15) from -t.
    np.testing.assert_allclose(pca.project(points)[:, 0], -t, rtol=0, atol=1e-14)


def test_pca_refuses_too_few_points_or_too_many_components():
    with pytest.raises(ValueError, match="a PCA with k=2 components needs at least 2 points"):
        fit_pca(np.ones((1, 4)), k=2)
    with pytest.raises(ValueError, match="got 3 points of dimension 2"):
        fit_pca(np.ones((3, 2)), k=3)


# ---------------------------------------------------------------------------------------------
# Bad input


def test_an_unknown_experiment_is_refused_with_the_list(capsys):
    with pytest.raises(SystemExit, match="unknown experiment 'siamese-vs-quadruplet'; choose one of siamese-vs-triplet"):
        command.main(["siamese-vs-quadruplet"])


def test_an_unknown_model_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(SystemExit, match="'no-such-model' is neither a model directory nor a known model name"):
        command.main(["siamese-vs-triplet", "--quick", "--model", "no-such-model", "--output", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_data_without_a_train_split_is_refused(tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(REPO / "data" / "example", folder)
    (folder / "qrels" / "train.tsv").unlink()
    with pytest.raises(FileNotFoundError, match=r"no qrels for split 'train': .* \(splits found: \['dev', 'test'\]\)"):
        run(siamese_vs_triplet, tmp_path / "run", "--data", str(folder))


def test_an_output_folder_with_other_settings_is_refused(svt_run, tmp_path):
    output = tmp_path / "run"
    shutil.copytree(svt_run[0], output)
    with pytest.raises(ValueError, match=r"holds a run of siamese-vs-triplet with other settings \(they differ in "
                                         r"\['margins'\]\); run the same command as before"):
        run(siamese_vs_triplet, output, "--margin", "1")


@pytest.mark.parametrize("option, value, message", [
    ("--margin", "-1", "--margins cannot be negative, got [-1.0]"),
    ("--examples", "0", "--examples must be positive, got 0"),
    ("--seeds", "0", "--seeds must be positive, got 0"),
])
def test_a_bad_option_is_refused(option, value, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        run(siamese_vs_triplet, tmp_path / "run", option, value)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# The papers' start: raw DistilBERT and RoBERTa checkpoints (random weights here, offline)


@pytest.mark.parametrize("study", [siamese_vs_triplet, embedding_size, sbert_objectives])
@pytest.mark.parametrize("checkpoint", ["tiny_distilbert", "tiny_roberta"])
def test_every_study_starts_from_a_raw_transformer_checkpoint(study, checkpoint, tmp_path):
    """The papers fine-tune raw DistilBERT and RoBERTa (no sentence-transformers layout: mean pooling,
    no normalisation); `--model distilbert-base-uncased` fetches such a checkpoint, the fixtures stand
    in for it offline."""
    options = ["--synthetic", "300"] if study is embedding_size else []
    if study is sbert_objectives:
        stsb, sick = write_sts_and_sick(tmp_path / "data")
        options = ["--stsb", str(stsb), "--sick", str(sick), "--batch-size", "4"]
    output = tmp_path / "run"
    study.main(["--quick", "--model", str(FIXTURES / checkpoint), "--device", "cpu", "--output", str(output), *options])
    results = json.loads((output / "results.json").read_text())
    assert results["settings"]["model"] == str(FIXTURES / checkpoint)
    assert results["tests"] and (output / "results.md").is_file()


def test_a_study_folder_holding_no_model_yet_takes_other_settings(tmp_path):
    """A run refused before its first model (embedding-size --quick with too large a D, say) leaves
    settings.json behind; running again with other settings replaces them. Once a model exists, the
    settings are the run's."""
    runner.Study(tmp_path, "embedding-size", argparse.Namespace(dims=[64], data="example"))
    runner.Study(tmp_path, "embedding-size", argparse.Namespace(dims=[8], data="example"))
    assert json.loads((tmp_path / "settings.json").read_text())["dims"] == [8]
    (tmp_path / "models" / "d8-seed42").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"with other settings \(they differ in \['dims'\]\)"):
        runner.Study(tmp_path, "embedding-size", argparse.Namespace(dims=[16], data="example"))
