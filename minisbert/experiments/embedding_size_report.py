"""The write-up of the embedding-size study (embedding_size.py): results.md's tables and sentences,
made from the stored results and tests alone, so that --report-only rebuilds them, and the paper's
numbers it sets beside the run: Bagge, Topsøe and Rørhauge, "SRoBERTa yields similar performance on
duplicate question retrieval using reduced embedding sizes" (DTU), Table 1.

Checked in tests/experiments/test_study_writeups.py (every number against its key) and tests/experiments/test_experiments.py.
"""

import math

from . import records, runner, verdicts

MAIN_METRIC, MAIN_LABEL = "ndcg@10", "NDCG@10"
GAP_METRIC = "accuracy@1 - accuracy@5"  # the metric verdicts.difference_of makes for the gap claim
SPEED_ROUNDS = 3  # the rounds embedding_size.py's `search_speed` times every D in

# Bagge et al.'s Table 1, top-1 accuracy on Quora: the base model and the projections to each D.
PAPER_ACCURACY = {"base": 0.959, 8: 0.687, 64: 0.893, 128: 0.901, 512: 0.925, 768: 0.906, 1024: 0.953, 2048: 0.95}
PAPER_UNTRAINED_ACCURACY = 0.641  # Table 1, "baseline 1": the untrained base model's top-1 accuracy


def deviations(s, width: int, results: dict, run: dict) -> str:
    """The table of what this run does differently from Bagge et al., and why."""
    seconds = [r["training"]["seconds"] for dim in s.dims for r in results[f"d{dim}"]["runs"]]
    rows = [
        ["data", "Quora duplicate-question triplets (about 100,000), split 80/15/5 %; each of about 10,000 test "
         "questions retrieves its duplicate",
         f"{s.data}" + ("" if runner.holds_quora(s.data) else
                        ": triplets mined from the train split, the test split's queries over its corpus"),
         f"{records.preset_why(run)}; --data FOLDER with quora_duplicate_questions.tsv "
         "runs the paper's split"],
        ["start model", "RoBERTa-base, not yet a sentence encoder (H = 768)", f"{s.model} (H = {width}), already "
         "trained for sentence similarity", "the one BERT-family checkpoint these machines can fetch (the Hugging Face "
         "hub is unreachable from them)"],
        ["dimensions D", "8, 64, 128, 512, 768, 1024, 2048", ", ".join(map(str, s.dims)),
         "the preset's: fourfold steps, the width and twice it"],
        ["projection's start", "a linear layer's random initialisation", "the PCA of the start model's training "
         "embeddings (D <= H), the identity padded with zeros (D > H)", "a random draw scrambles the pretrained "
         "space before training begins, which a budget of a few epochs does not repair"],
        ["dropout before the projection", "0.1", "none", "minisbert's Dense layer has none; whether it matters "
         "here is not tested"],
        ["projection's learning rate", "the encoder's (not stated otherwise)", f"{s.projection_lr:g} (the encoder "
         f"{s.lr:g})", "a layer that starts from a PCA and not from pretrained weights moves little at 2e-5"],
        ["epochs", "10 (converged after about 2)", str(s.epochs), f"{records.preset_why(run)}; --epochs"],
        ["device and time", "a T4 GPU for the speed; training's not stated", f"{records.machines(run)}; "
         f"{min(seconds) / 60:.1f} to {max(seconds) / 60:.1f} min a network", "the machine the models were made on "
         "(run.json)"],
        ["batch", "not stated", str(s.batch_size), "SBERT's"],
        ["margin", "0.05", f"{s.margin:g}", "the paper's"],
        ["metric", "top-k accuracy, k = 1 to 5", f"{MAIN_LABEL} (tested), top-1 and top-10 accuracy beside it, "
         "top-1 tested against the base model", "SciFact judges several documents for some queries, which "
         "NDCG@10 counts and accuracy does not"],
        ["speed", "seconds for 10^9 pairwise distances on a T4 GPU", "queries per second of exact top-10 search "
         "on the CPU", "what a user of the embeddings waits for"],
        ["seeds", "not stated", ", ".join(map(str, runner.seed_list(s))),
         "training variance: every test draws the seeds as well as the queries"],
    ]
    return runner.deviation_table(rows)


def report(s, about: str, results: dict, tests: dict, speed: dict, num_documents: int, quora: bool, run: dict,
           margin_record: str) -> str:
    seeds = runner.seed_list(s)
    width = results["untrained"]["dim"]
    num_triplets = results["base"]["runs"][0]["training"]["examples"]
    num_queries = len(results["untrained"]["per_query"][MAIN_METRIC])
    rows = [[f"D = {dim}", runner.mean_cell(results[f"d{dim}"], MAIN_METRIC)]
            + [f"{results[f'd{dim}']['scores'][m]:.4f}" for m in ("accuracy@1", "accuracy@10")]
            + [verdicts.difference_cell(tests["against_start"][str(dim)]),
               verdicts.difference_cell(tests["against_base"][str(dim)]), f"{results[f'pca{dim}']['scores'][MAIN_METRIC]:.4f}",
               projection_cell(tests["against_projection"][str(dim)]),
               f"{speed['test'][i]:,.0f}", f"{speed['synthetic'][i]:,.0f}",
               runner.minutes([r["training"]["seconds"] for r in results[f"d{dim}"]["runs"]]),
               f"{results[f'd{dim}']['runs'][0]['training']['steps']:,}"] for i, dim in enumerate(s.dims)]
    others = [(f"base model: trained, no projection (D = {width})", "base"),
              (f"start model, untrained, euclidean (D = {width})", "untrained-euclidean"),
              (f"start model, untrained, cosine (D = {width})", "untrained"), ("Jaccard (words)", "jaccard")]
    rows += [[label, runner.mean_cell(results[name], MAIN_METRIC)]
             + [f"{results[name]['scores'][m]:.4f}" for m in ("accuracy@1", "accuracy@10")] + ["-"] * 8
             for label, name in others]
    every_test = [t for family in tests.values() for t in (family.values() if "difference" not in family else [family])
                  if "tested_in" not in t]
    lines = [
        "# Embedding size",
        "",
        "After Bagge, Topsøe and Rørhauge, \"SRoBERTa yields similar performance on duplicate question retrieval "
        "using reduced embedding sizes\": a linear projection to D dimensions after pooling, trained with the "
        "triplet loss on euclidean distance, beside the same network trained without it (the base model).",
        "",
        f"Data: {s.data}, train -> test; {num_triplets:,} training triplets ("
        + ("duplicate pairs split 80/15/5 %, negatives the questions the file judges not duplicates; each test question "
           "retrieves its duplicate from the pooled test questions, itself excluded" if quora else
           "negatives mined once with the start model")
        + f"), {num_queries:,} test queries over {num_documents:,} documents. Start model {s.model}, "
        f"normalisation off; at most {s.max_seq_length} tokens per text; {s.epochs} epoch(s), batch {s.batch_size}, "
        f"learning rate {s.lr:g} (the projection {s.projection_lr:g}, starting from the PCA of the start model's "
        f"training embeddings, or the identity padded with zeros above D = {width}), margin {s.margin:g}, "
        f"seeds {', '.join(map(str, seeds))}. Differences: {MAIN_LABEL}, mean difference, 95% interval and p, "
        f"Holm-adjusted over the sizes (identical models are not tested and not counted)"
        + ("; ± is the standard deviation over the seeds" if len(seeds) > 1 else "")
        + f". {verdicts.method_text(every_test)} Search speed: exact "
        f"top-10, {num_queries:,} queries, over the test corpus and over {s.synthetic:,} random vectors, the "
        f"fastest of {SPEED_ROUNDS} alternating rounds. " + about,
        "",
        runner.markdown_table(["model", MAIN_LABEL, "Accuracy@1", "Accuracy@10", "difference from the start model",
                               "difference from the base model",
                               f"untrained PCA projection, {MAIN_LABEL}", "difference from the untrained projection",
                               "queries/s, test corpus", f"queries/s, {s.synthetic:,} random", "training time", "steps"],
                              rows),
        "**What the size alone costs**: the untrained PCA projection to each D against the start model "
        "(euclidean), Holm-adjusted over the sizes:",
        "",
        *[f"- D = {dim}: "
          f"{verdicts.verdict(tests['projection_cost'][str(dim)], MAIN_LABEL, 'projected', 'start', 'p_holm')}."
          for dim in s.dims],
        "",
        training_summary(tests, s.dims),
        "",
        "**Equivalence margin**: " + verdicts.MARGIN_REASON + "; \"bound\" is the smallest margin at which the "
        "same adjusted equivalence test would hold. " + margin_record,
        "",
        "**The paper's claims**, each beside what this run finds:",
        "",
        runner.claims_table(paper_claims(s, results, tests, speed)),
        "## Where this run departs from the paper",
        "",
        deviations(s, width, results, run),
        against_the_paper(s, results, tests),
        "",
        "Figure: dims.png (left: each trained D and each untrained projection against the untrained start model, "
        "each trained D against the base model (paired), with their 95% intervals, each seed's own difference beside "
        f"its mean, and the equivalence margin, {verdicts.NDCG_MARGIN:g} either side of 0; right: search speed against D).",
        "",
    ]
    return "\n".join(lines)


def training_summary(tests: dict, dims: list) -> str:
    """What training did: the base model against the start, each D against the start, its own
    untrained projection and the base model, each as verdicts.verdict says it (Holm-adjusted p)."""
    said = ["**Training**, Holm-adjusted over the sizes:", "",
            f"- The base model against the untrained start model (euclidean): "
            f"{verdicts.verdict(tests['base_moved'], MAIN_LABEL, 'base', 'start', 'p_holm')}."]
    for family, other in (("against_start", "start"), ("against_projection", "untrained projection"),
                          ("against_base", "base")):
        said += [f"- D = {dim} against the {other}: " + (
                     "the untrained projection at this D is the start model (every query's NDCG@10 equal in every "
                     "seed), so this is the comparison against the start above, tested once there."
                     if "tested_in" in tests[family][str(dim)] else
                     f"{verdicts.verdict(tests[family][str(dim)], MAIN_LABEL, f'D = {dim}', other, 'p_holm')}.")
                 for dim in dims]
    return "\n".join(said)


def projection_cell(test: dict) -> str:
    """The table's cell against the untrained projection: the test's, or where the projection is the start
    model, a pointer to the start column (the same comparison, tested once)."""
    return "the start model's column (the same networks)" if "tested_in" in test else verdicts.difference_cell(test)


def against_the_paper(s, results: dict, tests: dict) -> str:
    """The paper's finding that the base model beats every projection, against this run, on the
    paper's metric (top-1 accuracy) and on NDCG@10."""
    lines = ["", "**Where the results part from the paper.** In the paper's Table 1 the base model beats every "
             f"projection on top-1 accuracy ({PAPER_ACCURACY['base']:.3f}; D = 768: {PAPER_ACCURACY[768]:.3f}, "
             f"D = 1024: {PAPER_ACCURACY[1024]:.3f}, D = 8: {PAPER_ACCURACY[8]:.3f}). Here, on top-1 accuracy "
             f"(base model {results['base']['scores']['accuracy@1']:.4f}), Holm-adjusted over the sizes:", ""]
    for dim in s.dims:
        paper = f" (paper: {PAPER_ACCURACY[dim]:.3f})" if dim in PAPER_ACCURACY else ""
        test = tests["accuracy_against_base"][str(dim)]
        lines.append(f"- D = {dim}{paper}: {results[f'd{dim}']['scores']['accuracy@1']:.4f}, "
                     f"{verdicts.verdict(test, 'Accuracy@1', f'D = {dim}', 'base', 'p_holm')}.")
    worse = [dim for dim in s.dims if verdicts.outcome(tests["against_start"][str(dim)], "p_holm")[0] == "prefers"
             and tests["against_start"][str(dim)]["difference"] < 0]
    if worse:
        lines += ["", "The paper concludes that \"severely reducing the embedding sizes will only marginally affect "
                  "performance\" (abstract). Here, against the untrained start model (euclidean), " + "; ".join(
                      f"D = {dim} loses {-tests['against_start'][str(dim)]['difference']:.4f} {MAIN_LABEL} (top-1 "
                      f"accuracy {results[f'd{dim}']['scores']['accuracy@1']:.4f} against the base model's "
                      f"{results['base']['scores']['accuracy@1']:.4f})" for dim in worse)
                  + f": more than marginal on {MAIN_LABEL}, which is not the paper's metric (top-k accuracy)."]
    better = [dim for dim in s.dims if verdicts.outcome(tests["against_base"][str(dim)], "p_holm") == ("prefers", 1)]
    if better:
        lines += ["", f"On {MAIN_LABEL}, D = {', '.join(map(str, better))} beat the base model detectably, where "
                  "the paper's base model beats every projection. What may explain it (a reading, not tested here): "
                  "the base model here starts as a sentence encoder already, where the paper's is raw RoBERTa, so training can "
                  "cost it ground (see Training above); a projection that starts from the PCA and learns at a higher "
                  "rate than the encoder can meet the loss with less change to the encoder, while the paper's starts "
                  "at random and must be learnt from nothing."]
    return "\n".join(lines)


def gap_claim(s, results: dict, test: dict | None) -> list:
    """The claim that sizes differ less at top 5 than at top 1 (section 5, under Table 1), decided by the
    largest D against the smallest on top-1 accuracy less top-5 accuracy ("accuracy_gap_shrinks": its
    difference is the top-1 gap less the top-5 gap, positive where the gap shrinks)."""
    claim = ["the differences in accuracy decrease from top-1 to top-5 testing", "5; Table 1",
             "the sizes' top-1 accuracies spread wider than their top-5 ones (\"at the top 3 testings, the "
             "difference between using e.g. 64 and 512 dimensions seems quite small\")"]
    if test is None:
        return [*claim, "one D only", runner.NOT_COMPARABLE]
    large, small = (results[f"d{dim}"]["scores"] for dim in (s.dims[-1], s.dims[0]))
    names = f"D = {s.dims[-1]}", f"D = {s.dims[0]}"
    word, sign = verdicts.outcome(test, "p_holm")
    found = ("the same on every query in every seed (not tested)" if word == "identical" else
             ({1: "the gap shrinks", -1: "the gap grows"}[sign] if word == "prefers" else word)
             + f" ({verdicts.figures_text(test)})")
    return [*claim, f"{names[0]} against {names[1]}: top-1 accuracy {large['accuracy@1']:.4f} against "
            f"{small['accuracy@1']:.4f}, top-5 {large['accuracy@5']:.4f} against {small['accuracy@5']:.4f}; the top-1 gap "
            f"less the top-5 gap ({GAP_METRIC} of {names[0]} against {names[1]}): {found}",
            runner.preference_label((word, sign), 1)]


def steps_label(tests: dict) -> str:
    """"Larger is better" against each step's test: every step found larger better, AGREES; any step found
    smaller better, DISAGREES; else NOT_SHOWN; no steps (one D), NOT_COMPARABLE."""
    if not tests:
        return runner.NOT_COMPARABLE
    labels = [runner.preference_label(verdicts.outcome(test, "p_holm"), 1) for test in tests.values()]
    return runner.DISAGREES if runner.DISAGREES in labels else runner.NOT_SHOWN if runner.NOT_SHOWN in labels \
        else runner.AGREES


def paper_claims(s, results: dict, tests: dict, speed: dict) -> list:
    """Bagge et al.'s claims beside this run (runner.claims_table's rows): each claim, its section, the
    paper's figure, this run's, and whether this run agrees (a claimed difference agrees only where the
    test here finds it)."""
    accuracy = {dim: results[f"d{dim}"]["scores"]["accuracy@1"] for dim in s.dims}
    base = results["base"]["scores"]
    start = results["untrained-euclidean"]["scores"]

    def each(family, other):  # each D's verdict, words only (the figures are in the sentences above)
        return "; ".join(f"D = {dim}: " + verdicts.said(verdicts.outcome(tests[family][str(dim)], "p_holm"), f"D = {dim}",
                                                        other, verdicts.NDCG_MARGIN) for dim in s.dims)

    def base_preferred(family):
        return [dim for dim in s.dims if verdicts.outcome(tests[family][str(dim)], "p_holm") == ("prefers", -1)]
    beaten, worse = base_preferred("accuracy_against_base"), base_preferred("against_base")
    moved = verdicts.outcome(tests["base_moved"], "p_holm")
    names = {"test": "test corpus", "synthetic": f"{s.synthetic:,} random vectors"}
    slopes = ({corpus: math.log(qps[0] / qps[-1]) / math.log(s.dims[-1] / s.dims[0]) for corpus, qps in speed.items()}
              if s.dims[-1] != s.dims[0] else {})
    return [
        ["the base model beats every projection on top-1 accuracy", "4; Table 1",
         f"{PAPER_ACCURACY['base']:.3f}; D = 768: {PAPER_ACCURACY[768]:.3f}, D = 8: {PAPER_ACCURACY[8]:.3f}",
         f"base {base['accuracy@1']:.4f}; " + ", ".join(f"D = {dim}: {accuracy[dim]:.4f}" for dim in s.dims)
         + f"; Accuracy@1 tested: {each('accuracy_against_base', 'base')}",
         runner.AGREES if len(beaten) == len(s.dims) else runner.DISAGREES if any(
             verdicts.outcome(tests["accuracy_against_base"][str(dim)], "p_holm") == ("prefers", 1) for dim in s.dims)
         else runner.NOT_SHOWN],
        ["fine-tuning the base model improves it over the untrained one", "5; Table 1",
         f"top-1 accuracy {PAPER_ACCURACY['base']:.3f} against {PAPER_UNTRAINED_ACCURACY:.3f}",
         f"top-1 accuracy {base['accuracy@1']:.4f} against {start['accuracy@1']:.4f}; NDCG@10 "
         f"{verdicts.brief(tests['base_moved'], 'base', 'start')}",
         runner.preference_label(moved, 1)],
        ["severely reducing the embedding size only marginally affects performance", "abstract; 1",
         f"top-1 accuracy {PAPER_ACCURACY[8]:.3f} at D = 8 against {PAPER_ACCURACY['base']:.3f}",
         f"NDCG@10 against the base model: {each('against_base', 'base')}",
         runner.AGREES if not worse else runner.DISAGREES],
        ["larger embeddings give higher accuracies on the test set", "5",
         "top-1 accuracy rising with D in Table 1",
         "top-1 accuracy, each D against the next smaller: " + "; ".join(
             f"D = {pair.split(':')[0]} against D = {pair.split(':')[1]}: " + verdicts.brief(
                 test, f"D = {pair.split(':')[0]}", f"D = {pair.split(':')[1]}") for pair, test in
             tests.get("accuracy_larger", {}).items()),
         steps_label(tests.get("accuracy_larger", {}))],
        gap_claim(s, results, tests.get("accuracy_gap_shrinks")),
        ["the computation time doubles when the embedding size doubles", "5; Fig. 4",
         "time proportional to D (10^9 distances on a T4 GPU)",
         "; ".join(f"{names[corpus]}: time grows as D^{slope:.2f} from D = {s.dims[0]} to {s.dims[-1]}"
                   for corpus, slope in slopes.items()) + " (doubling: D^1); a top-10 search on a CPU, not the paper's "
         "10^9 distances on a GPU: not the same quantity" if slopes else "one D only",
         runner.NOT_COMPARABLE],  # another quantity: 10^9 distances on a GPU, not a top-10 search on a CPU
    ]
