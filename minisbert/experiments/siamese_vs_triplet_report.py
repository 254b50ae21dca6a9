"""The write-up of the Siamese vs. Triplet study (siamese_vs_triplet.py): results.md's tables and
sentences, and its figures, made from the stored results and tests alone, so that --report-only
rebuilds them. Every function takes the study's networks as `trained` ((name, label, arch, measure,
margin), siamese_vs_triplet.py's `networks`). The paper's facts it sets beside the run are here:
Rygaard, Bramsløw, Jensen and Bagger, "Distance Dilemma: Siamese vs. Triplet SBERT Networks for
Information Retrieval" (DTU).

Checked in tests/experiments/test_study_writeups.py (every number against its key) and tests/experiments/test_experiments.py.
"""

import numpy as np

from . import figures, records, runner, verdicts

MAIN_METRIC, MAIN_LABEL = "ndcg@10", "NDCG@10"
BASELINE_LABELS = {"untrained": "start model, untrained", "untrained-euclidean": "start model, untrained",
                   "bm25": "BM25"}
PAPER_MARGIN = 5.0  # the paper's triplet margin (section 2.3.2)
PAPER_HOURS = {"Siamese": 11, "Triplet": 15}  # the paper's training time for 3 epochs on a V100 (sections 4.2, 6)
PAPER_EPOCHS = 3  # the paper trains every network 3 epochs (sections 4.2, 6): its claims are decided at that setting


def deviations(s, trained: list, results: dict, run: dict) -> str:
    """The table of what this run does differently from Rygaard et al., and why; the device, time and
    seeds are the run's own (run.json and each model's training record)."""
    seconds = {f"{name}-seed{seed}": r["training"]["seconds"] for name, *_ in trained
               for seed, r in zip(runner.seed_list(s), results[name]["runs"])}
    preset = records.preset_why(run)
    budget = f"{preset}; --data FOLDER with MS MARCO's files reads the paper's"
    rows = [
        ["training data", "MS MARCO: 125,000 training queries, a positive passage and the hard negatives of "
         "sentence-transformers' msmarco-hard-negatives (section 2.1)",
         f"{s.data}: one triplet per judged (query, relevant document) of the train split", budget],
        ["negatives", "MS MARCO's hard negatives, those within 3 (logits) of the positive's cross-encoder score "
         "dropped", "one of the start model's top 10 documents that is not judged relevant, mined once",
         "SciFact has no mined negatives"],
        ["Siamese labels", "cross-encoder scores through a sigmoid: continuous in (0, 1)",
         "1 for the judged document, 0 for the mined negative",
         "SciFact has no cross-encoder scores; the paper's note that continuous labels help the Siamese networks "
         "(section 5.2.1) cannot be checked here"],
        ["test data", "200 MS MARCO queries over about 8,800,000 passages", f"{s.data} test split",
         "the same as the training data"],
        ["start model", "DistilBERT, not yet a sentence encoder", f"{s.model}, already trained for sentence "
         "similarity", "the one BERT-family checkpoint these machines can fetch (the Hugging Face hub is unreachable "
         "from them); --model distilbert-base-uncased asks the paper's question where it is reachable"],
        ["device and time", "an NVIDIA V100; 3 epochs in about 11 hours (Siamese) and 15 (Triplet), section 4.2",
         records.minutes(run, seconds),
         records.time_why(run)],
        ["batch", "64", str(s.batch_size), f"{preset}; --batch-size 64"],
        ["epochs", "3", str(s.epochs), f"{preset}; --epochs 3"],
        ["triplet margin", "5 (1 tried for Triplet cosine, section 4.1)", ", ".join(f"{m:g}" for m in s.margins),
         "cosine distances cannot reach 5, and the paper asks whether the margin should be tuned (section 4.2)"],
        ["learning rate", "not stated; decaying linearly, gradients clipped", f"{s.lr:g}, warmup then linear decay, "
         "gradient norm clipped at 1", "SBERT's"],
        ["regularisation", "an L2 penalty on the weights (strength not stated)", "AdamW weight decay 0.01",
         "SBERT's"],
        ["text length", "not stated", f"{s.max_seq_length} tokens", "the preset's"],
        ["NDCG", "the ideal ranking holds 10 relevant passages, as every query is said to have at least 10",
         "the ideal ranking holds the query's judged documents (sentence-transformers' definition)",
         "SciFact judges 1 to 5 documents per query: the paper's ideal would cap every query's NDCG far below 1"],
        ["seeds", "not stated", ", ".join(map(str, runner.seed_list(s))),
         "training variance: every test draws the seeds as well as the queries"],
    ]
    return runner.deviation_table(rows)


def same_networks(trained: list, results: dict) -> list:
    """(name, name of the earlier network it equals, the margins' difference or None): networks whose
    NDCG@10 is the same on every query in every seed. For two Triplet networks of one measure that
    differ only in margin, the difference of margins is given where every step's loss differs by
    exactly it: the hinge was never switched off at either margin, so the gradients, and the network,
    are the same."""
    found = []
    for i, (name, _, arch, measure, margin) in enumerate(trained):
        for other, _, other_arch, other_measure, other_margin in trained[:i]:
            if verdicts.identical(results[name], results[other], MAIN_METRIC):
                shift = None
                if (arch, measure) == (other_arch, other_measure) == ("triplet", measure) and margin != other_margin:
                    gaps = [np.subtract(r["training"]["loss"], q["training"]["loss"])
                            for r, q in zip(results[name]["runs"], results[other]["runs"])]
                    if all(np.allclose(gap, margin - other_margin, atol=1e-4) for gap in gaps):
                        shift = margin - other_margin
                found.append((name, other, shift))
                break
    return found


def report(s, trained: list, about: str, results: dict, tests: dict, num_queries: int, num_documents: int,
           run: dict, margin_record: str) -> str:
    """results.md: the paper's table for `trained` (the study's `networks`) and the controls, each
    network's tested difference, the verdicts, and where this run departs from the paper."""
    seeds = runner.seed_list(s)
    rows = [(label, results[name]) for name, label, *_ in trained] + [
        (f"{BASELINE_LABELS[name]} ({results[name]['measure']})" if name != "bm25" else "BM25", results[name])
        for name in ("untrained", "untrained-euclidean", "bm25")]
    every_test = list(tests["against_start"].values()) + list(tests["measures"].values()) + (
        [tests["on_par"]] if "on_par" in tests else [])
    labels = {name: label for name, label, *_ in trained}
    same = [f"{labels[name]} and {labels[other]} are one network: their NDCG@10 is equal on every query in every "
            "seed" + (f", and every step's loss is {shift:g} higher, the difference of the margins: the cosine "
                      "distances never brought the hinge to 0 at either margin, so both were trained by the same "
                      "gradients" if shift is not None else "") + ". It is tested once (Holm counts it once)."
            for name, other, shift in same_networks(trained, results)]
    copies = {name: other for name, other, _ in same_networks(trained, results)}
    lines = [
        "# Siamese vs. Triplet networks for retrieval",
        "",
        "After Rygaard, Bramsløw, Jensen and Bagger, \"Distance Dilemma: Siamese vs. Triplet SBERT Networks "
        "for Information Retrieval\". Networks trained from the same start model on the same data, each "
        "retrieving with the measure it was trained with.",
        "",
        f"Data: {s.data}, train -> test; {results[trained[-1][0]]['runs'][0]['training']['examples']:,} training "
        f"triplets (hard negatives mined once with the start model; the Siamese networks see each triplet as two "
        f"pairs labelled 1 and 0), {num_queries:,} test queries over {num_documents:,} documents. Start model "
        f"{s.model}, normalisation off for training; at most {s.max_seq_length} tokens per text; {s.epochs} "
        f"epoch(s), batch {s.batch_size}, learning rate {s.lr:g}, triplet margins {', '.join(f'{m:g}' for m in s.margins)}; "
        f"seeds {', '.join(map(str, seeds))} (every number of a trained network is the mean over its seeds). " + about,
        "",
        runner.markdown_table(["model", "measure"] + runner.metric_header(),
                              [[label, r["measure"]] + runner.metric_cells(r["scores"]) for label, r in rows]),
        f"Each network against the start model scored with the same measure, {MAIN_LABEL}: the mean difference, "
        f"its 95% interval and p, Holm-adjusted over the {len(trained) - len(same)} distinct networks"
        + ("; ± is the standard deviation over the seeds" if len(seeds) > 1 else "") + ". "
        + verdicts.method_text(every_test),
        "",
        *[line for sentence in same for line in (sentence, "")],
        runner.markdown_table(
            ["model", MAIN_LABEL, "difference from the start model", "loss, first step", "loss, last step",
             "training time", "examples", "steps"],
            [[label, runner.mean_cell(results[name], MAIN_METRIC),
              f"one network with {labels[copies[name]]}" if name in copies else
              verdicts.difference_cell(tests["against_start"][name]),
              f"{np.mean([r['training']['loss'][0] for r in results[name]['runs']]):.4f}",
              f"{np.mean([r['training']['loss'][-1] for r in results[name]['runs']]):.4f}",
              runner.minutes([r["training"]["seconds"] for r in results[name]["runs"]]),
              f"{results[name]['runs'][0]['training']['examples']:,}", f"{results[name]['runs'][0]['training']['steps']:,}"]
             for name, label, *_ in trained]),
        finding(trained, results, tests),
        "",
        "**Equivalence margin**: " + verdicts.MARGIN_REASON + ". A network whose equivalence test (the crossed "
        f"t's, Holm-adjusted) puts its difference within {verdicts.NDCG_MARGIN:g} of 0 is called equivalent; one whose "
        "tests can tell neither way is called not detectable, with its interval; \"bound\" is the smallest margin at "
        "which the same adjusted equivalence test would hold. " + margin_record,
        "",
        "**The paper's claims**, each beside what this run finds:",
        "",
        runner.claims_table(paper_claims(trained, results, tests, run, s.epochs)),
        "## Where this run departs from the paper",
        "",
        deviations(s, trained, results, run),
        against_the_paper(trained, results, tests),
        "",
        "Figures: loss.png (training loss per step, first seed; Siamese on a log scale, Triplet on a linear one), "
        "pca.png (PCA of the normalised test-triplet embeddings, five triplets, first seed), differences.png (each "
        "network's NDCG@10 difference from the start model: the bar the 95% interval over seeds and queries, the dot filled "
        f"where the Holm-adjusted p is below 0.05, each seed's own difference below it, the equivalence margin "
        f"({verdicts.NDCG_MARGIN:g} either side of 0) as a grey band).",
        "",
    ]
    return "\n".join(lines)


def finding(trained: list, results: dict, tests: dict) -> str:
    """The paper's finding (Siamese prefers cosine, Triplet prefers euclidean) against this run's
    tests, and what each network's test against the start model says."""
    lines = [f"**Against the paper's finding** (Siamese prefers cosine, Triplet prefers euclidean), {MAIN_LABEL}, "
             f"p Holm-adjusted over the {len(tests['measures'])} comparisons:", ""]
    for network, test in tests["measures"].items():
        lines.append(f"- {network}: {verdicts.verdict(test, MAIN_LABEL, 'cosine', 'euclidean', p_key='p_holm')}: "
                     f"{agreement(network, test)}.")
    lines += ["", "**Each network against the start model** (Holm-adjusted over the networks):", ""]
    labels = {name: label for name, label, *_ in trained}
    copies = {name: other for name, other, _ in same_networks(trained, results)}
    lines += [f"- {labels[name]}: one network with {labels[copies[name]]} (above)." if name in copies else
              f"- {labels[name]}: {verdicts.verdict(test, MAIN_LABEL, 'trained', 'start model', p_key='p_holm')}."
              for name, test in tests["against_start"].items()]
    return "\n".join(lines)


def agreement(network: str, test: dict) -> str:
    """How the test of cosine - euclidean (p_holm) stands to the paper's preference for this architecture."""
    expected = 1 if network.startswith("Siamese") else -1
    word, sign = verdicts.outcome(test, "p_holm")
    if word == "prefers":
        return "as the paper finds" if sign == expected else "the opposite of the paper"
    return "the paper's preference is not reproduced here"


def against_the_paper(trained: list, results: dict, tests: dict) -> str:
    """Every place where this run's results and the paper's part, generated from the tests and the
    runs' records, with both numbers where the paper gives them."""
    siamese = tests["measures"]["Siamese network"]
    lines = ["", "**Where the results part from the paper.**", ""]
    if verdicts.outcome(siamese, "p_holm")[0] == "prefers":
        lines.append(
            f"- The paper's Siamese network shows little preference between the measures (cosine slightly better, "
            f"section 5.2.1). Here Siamese euclidean reaches {MAIN_LABEL} "
            f"{results['siamese-euclidean']['scores'][MAIN_METRIC]:.4f} against cosine's "
            f"{results['siamese-cosine']['scores'][MAIN_METRIC]:.4f}: "
            f"{verdicts.verdict(siamese, MAIN_LABEL, 'cosine', 'euclidean', 'p_holm')}. What may explain it (a reading, "
            "not tested here): the paper's labels are continuous and its start model is DistilBERT, whose distances the "
            "euclidean loss (target 1 - y) can bring to scale; here the labels are 1 and 0 and the start model's "
            "unnormalised embeddings lie several units apart, so the first steps shrink the whole space (loss.png).")
    for network, test in tests["measures"].items():
        if network.startswith("Triplet") and agreement(network, test) != "as the paper finds":
            lines.append(f"- The paper finds that the Triplet network strongly prefers euclidean distance (sections 4.1, "
                         f"5.2.2, at margin {PAPER_MARGIN:g}). {network}: "
                         f"{verdicts.verdict(test, MAIN_LABEL, 'cosine', 'euclidean', 'p_holm')}: {agreement(network, test)}.")
    if "on_par" in tests and verdicts.outcome(tests["on_par"], "p_holm")[0] != "equivalent":
        euclidean = f"triplet-euclidean-margin{PAPER_MARGIN:g}"
        lines.append(f"- The paper finds its two best networks, Siamese cosine and Triplet euclidean at margin "
                     f"{PAPER_MARGIN:g}, on par (section 4.1). Here they reach {results['siamese-cosine']['scores'][MAIN_METRIC]:.4f} "
                     f"and {results[euclidean]['scores'][MAIN_METRIC]:.4f}: "
                     f"{verdicts.verdict(tests['on_par'], MAIN_LABEL, 'Siamese cosine', 'Triplet euclidean', 'p_holm')}.")
    ratios = siamese_time_ratios(trained, results)  # medians: a network slowed by a shared machine counts little
    if ratios is not None and np.median(ratios) >= 1:
        steps = {arch: results[name]["runs"][0]["training"]["steps"] for name, _, a, *_ in trained
                 for arch in PAPER_HOURS if a == arch.lower()}
        lines.append(f"- The paper's Siamese network trains faster: about {PAPER_HOURS['Siamese']} hours for 3 epochs "
                     f"against {PAPER_HOURS['Triplet']} for the Triplet network (sections 4.2, 6), "
                     f"{PAPER_HOURS['Siamese'] / PAPER_HOURS['Triplet']:.2f} times as long. Here a Siamese network "
                     f"takes {np.median(ratios):.2f} times as long as a Triplet one (the median over the seeds of each "
                     f"seed's median Siamese time over its median Triplet time; {ratios.min():.2f} to "
                     f"{ratios.max():.2f} over the seeds): it sees each triplet as two pairs, {steps['Siamese']:,} "
                     f"steps against {steps['Triplet']:,}.")
    euclidean = f"triplet-euclidean-margin{PAPER_MARGIN:g}"
    if euclidean in results:
        last = np.mean([r["training"]["loss"][-1] for r in results[euclidean]["runs"]])
        if last > PAPER_MARGIN / 10:
            lines.append(f"- The paper's Triplet euclidean network at margin {PAPER_MARGIN:g} brings its loss very close "
                         f"to zero (section 4.2). Here its last step's loss is {last:.4f} (mean over the seeds).")
    return "\n".join(lines)


def paper_claims(trained: list, results: dict, tests: dict, run: dict, epochs: int = PAPER_EPOCHS) -> list:
    """Rygaard et al.'s claims beside this run (runner.claims_table's rows): each claim, its section, the
    paper's figure, this run's, and whether this run agrees. A claim of a preference agrees only where the
    test here finds it; ranks are by the means over the seeds (a rank is not a test: the tests are above).
    A claim is decided only at the paper's setting (PAPER_EPOCHS epochs): a run of other epochs shows its
    figures and calls every claim "not comparable", so that a claim has one label, the 3-epoch run's.
    Training times are compared only where every model was made on one machine with no pause recorded."""
    ndcg = {name: results[name]["scores"][MAIN_METRIC] for name, *_ in trained}
    labels = {name: label for name, label, *_ in trained}
    rows = []
    for network, expected, claim, section in (
            ("Siamese network", 1, "the Siamese network prefers cosine similarity", "abstract; 5.2.1"),
            (f"Triplet network, margin {PAPER_MARGIN:g}", -1, "the Triplet network strongly prefers euclidean distance",
             "abstract; 4.1; 5.2.2")):
        if network in tests["measures"]:
            test = tests["measures"][network]
            word = verdicts.outcome(test, "p_holm")
            rows.append([claim, section, "no figure in the text (its table is not printed)", f"{network}, cosine - euclidean: "
                         f"{verdicts.brief(test, 'cosine', 'euclidean')}",
                         runner.preference_label(word, expected)])
    if "on_par" in tests:
        word = verdicts.outcome(tests["on_par"], "p_holm")
        rows.append(["its two best networks, Siamese cosine and Triplet euclidean (margin 5), perform on par", "4.1",
                     "no figure", verdicts.brief(tests["on_par"], "Siamese cosine", "Triplet euclidean"),
                     runner.AGREES if word[0] == "equivalent" else
                     runner.NOT_SHOWN if word[0] == "not detectable" else runner.DISAGREES])
    small, paper = "triplet-cosine-margin1", f"triplet-cosine-margin{PAPER_MARGIN:g}"
    if small in ndcg and paper in ndcg:
        shifts = [shift for name, other, shift in same_networks(trained, results) if {name, other} == {small, paper}]
        rows.append([f"the Triplet cosine network trained with ε = 1 performs similarly to ε = {PAPER_MARGIN:g}", "4.1",
                     "no figure (\"similar performance\")",
                     f"{labels[small]}: {ndcg[small]:.4f}; {labels[paper]}: {ndcg[paper]:.4f}; " + (
                         "one network: its NDCG@10 equal on every query in every seed" + (
                             " (every step's loss the margins' difference apart: the hinge never reached 0, so the "
                             "margin did not change the gradient)" if shifts[0] is not None else "")
                         if shifts else "no test of the two against each other here"),
                     runner.AGREES if shifts else runner.NOT_COMPARABLE])
    for key, network, claim, paper, good in (
            ("poorest", f"triplet-cosine-margin{PAPER_MARGIN:g}",
             "the Triplet network with cosine similarity shows substantially poorer results than the rest",
             "no figure", {("prefers", 1)}),
            ("preferred", "siamese-cosine",
             "\"the Siamese network structure in combination with cosine similarity is to be preferred\"",
             "the shortest training of the two best networks", {("prefers", 1), ("equivalent", 0)})):
        if key in tests:
            rows.append([claim, "6", paper, *family_claim(tests[key], labels, network, key == "poorest", good)])
    ratios = siamese_time_ratios(trained, results)
    if ratios is not None:
        timed_alike = not records.paused(run) and " and " not in records.machines(run)
        rows.append(["the Siamese network trains faster than the Triplet network", "4.2; 6",
                     f"{PAPER_HOURS['Siamese']} h against {PAPER_HOURS['Triplet']} h for 3 epochs "
                     f"({PAPER_HOURS['Siamese'] / PAPER_HOURS['Triplet']:.2f} times as long)",
                     f"{np.median(ratios):.2f} times as long (median over the seeds; each seed's median Siamese "
                     "time over its median Triplet time" + ("" if timed_alike else
                                                            f"; made on {records.machines(run)}"
                                                            + ("; the times include the pauses and resumptions "
                                                               "run.json's notes name" if records.paused(run) else "")
                                                            + ": times not comparable") + ")",
                     runner.NOT_COMPARABLE if not timed_alike else
                     runner.AGREES if np.median(ratios) < 1 else runner.DISAGREES])
    if epochs != PAPER_EPOCHS:
        rows = [[claim, section, paper, f"{here}; {epochs} epochs here, {PAPER_EPOCHS} in the paper: decided by "
                 f"the {PAPER_EPOCHS}-epoch run", runner.NOT_COMPARABLE] for claim, section, paper, here, _ in rows]
    return rows


def family_claim(tests: dict, labels: dict, network: str, against: bool, good: set) -> list:
    """This run's cell and the label of a claim about `network` against every other (tests: the other
    network's name -> the test, the other network first where `against`, else `network`): AGREES where every
    test finds an outcome in `good`, DISAGREES where one finds another (an identical network, one network
    under two names, is left out), NOT_SHOWN where some cannot tell."""
    found = {other: verdicts.outcome(test, "p_holm") for other, test in tests.items()}
    tested = [word for word in found.values() if word[0] != "identical"]
    label = (runner.AGREES if all(word in good for word in tested) else
             runner.DISAGREES if any(word[0] != "not detectable" and word not in good for word in tested) else
             runner.NOT_SHOWN)
    cell = "; ".join(f"against {labels[other]}: " + ("identical (one network)" if word[0] == "identical" else
                                                     verdicts.brief(tests[other], *((labels[other], labels[network])
                                                                                    if against else
                                                                                    (labels[network], labels[other]))))
                     for other, word in found.items())
    return [f"{MAIN_LABEL}, {labels[network]} against each other network (Holm-adjusted): {cell}", label]


def siamese_time_ratios(trained: list, results: dict):
    """Each seed's median Siamese training time over its median Triplet time, (seeds,), within each seed so
    that seeds trained on machines of other speeds do not mix; None where a run took under 0.05 s."""
    seconds = {arch: np.array([[r["training"]["seconds"] for r in results[name]["runs"]] for name, _, a, *_ in trained
                               if a == arch.lower()]) for arch in PAPER_HOURS}  # (networks, seeds)
    triplet = np.median(seconds["Triplet"], axis=0)  # (seeds,)
    if not (triplet > 0).all():
        return None
    return np.median(seconds["Siamese"], axis=0) / triplet


def draw(output, trained: list, results: dict, tests: dict) -> None:
    """loss.png and pca.png from each network's first seed, differences.png from the tests."""
    figures.loss_curves(output / "loss.png", {
        arch.capitalize(): {label: results[name]["runs"][0]["training"]["loss"] for name, label, a, *_ in trained
                            if a == arch} for arch in ("siamese", "triplet")},
        log_scale={"Siamese"})  # MSE on cosines beside MSE on distances: two scales, in every run alike
    panels = {"start model, untrained": results["untrained"]["pca"]}
    panels.update({label: results[name]["runs"][0]["pca"] for name, label, *_ in trained})
    figures.pca_panels(output / "pca.png", panels)
    figures.differences(output / "differences.png", {label: verdicts.plotted(tests["against_start"][name])
                                                     for name, label, *_ in trained},
                        f"{MAIN_LABEL} difference from the start model (95% CI)", verdicts.NDCG_MARGIN)
