"""The papers' studies, apart from the library a user imports.

The studies minisbert was written to teach, each one command that trains, evaluates, and writes
its table and figures:

    python -m minisbert.experiments siamese-vs-triplet   Rygaard et al., "Distance Dilemma: Siamese vs.
                                                         Triplet SBERT Networks for Information Retrieval"
    python -m minisbert.experiments embedding-size       Bagge, Topsøe and Rørhauge, "SRoBERTa yields
                                                         similar performance on duplicate question
                                                         retrieval using reduced embedding sizes"
    python -m minisbert.experiments model-selection      Silveri, "Choosing the Right SBERT Model for
                                                         Your Data with BEIR"
    python -m minisbert.experiments sbert-objectives     Reimers and Gurevych, "Sentence-BERT", section 3
    python -m minisbert.experiments compare-runs A B     two finished runs' models tested against each other
    python -m minisbert.experiments summary              the README's paragraphs, from bench/studies

Each takes --quick (a small budget on data/example), --data, --model, --output DIR and --device, and
resumes: run again with the same --output, it skips the models already trained and evaluated;
--report-only rebuilds the tables and figures from a finished run's stored results alone.
One file per experiment (and for the two papers' studies a second, <study>_report.py, its write-up);
runner.py holds what they share, records.py the record of what made a run's models (run.json),
verdicts.py the tests and the words of each verdict, pca.py the PCA, figures.py the figures.
Checked in tests/experiments/test_experiments.py.
"""

# Experiment name -> the module that runs it (imported only when that experiment runs).
EXPERIMENTS = {
    "siamese-vs-triplet": "siamese_vs_triplet",
    "embedding-size": "embedding_size",
    "model-selection": "model_selection",
    "sbert-objectives": "sbert_objectives",
    "compare-runs": "compare_runs",
    "summary": "summary",
}
