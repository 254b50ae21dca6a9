"""Principal component analysis, written out: centre the rows, take the SVD, project.

For n points X (n, d) with column means mu, the centred matrix X - mu has the singular value
decomposition X - mu = U S V^T. The rows of V^T are the principal directions, ordered by the variance
along them, which is S_i^2 / (n - 1); a point x projects to (x - mu) V[:, :k]. The fraction of all
variance a direction explains is S_i^2 / sum_j S_j^2.

The sign of a direction is arbitrary (v and -v span the same line, and LAPACK may return either);
it is fixed here so that each direction's largest |coordinate| is positive, which makes the picture the
same on every machine.

Rygaard et al. ("Distance Dilemma", section 4.3, Fig. 2B) fit the PCA on normalised triplet embeddings
and plot five triplets in the first two components; siamese_vs_triplet.py does the same.
Checked against numpy's SVD and against the eigenvectors of the covariance matrix in
tests/experiments/test_experiments.py.
"""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PCA:
    mean: torch.Tensor  # (d,) the column means that were subtracted
    components: torch.Tensor  # (k, d) principal directions, most variance first, unit length
    explained_variance: torch.Tensor  # (k,) variance along each direction, S_i^2 / (n - 1)
    explained_ratio: torch.Tensor  # (k,) the share of all variance each direction explains

    def project(self, points) -> np.ndarray:
        """Coordinates (m, k) of points (m, d) in the principal directions."""
        points = torch.as_tensor(np.asarray(points), dtype=torch.float64)  # (m, d)
        return ((points - self.mean) @ self.components.T).numpy()  # (m, k)


def fit_pca(points, k: int = 2) -> PCA:
    """The first k principal directions of points (n, d), computed in float64."""
    points = torch.as_tensor(np.asarray(points), dtype=torch.float64)  # (n, d)
    n, d = points.shape
    if n < 2 or not 1 <= k <= min(n, d):
        raise ValueError(f"a PCA with k={k} components needs at least 2 points and k <= min(points, dims); "
                         f"got {n} points of dimension {d}")
    mean = points.mean(dim=0)  # (d,)
    _, singular_values, vt = torch.linalg.svd(points - mean, full_matrices=False)  # (min(n, d),), (min(n, d), d)
    components = vt[:k]  # (k, d)
    largest = components.abs().argmax(dim=1)  # (k,)
    signs = torch.sign(components[torch.arange(k), largest])  # (k,)
    variance = singular_values**2  # (min(n, d),)
    return PCA(mean=mean, components=components * signs[:, None], explained_variance=variance[:k] / (n - 1),
               explained_ratio=variance[:k] / variance.sum())
